// g++ unit tests of common/sample_math.h and of the host half of a device sampling step: the
// reference candidate selection against a full sort, and — the exactness claim of the CUDA route
// — that drawing from the best min(top_k, finite) candidates (sampler_run_candidates) gives the
// same token and leaves the same PRNG state as the CPU sampler on the whole row (sampler_run),
// over random rows with ties, NaN, -inf and +inf. Built by CMake as kvr_sample_math_test (with
// sampling.cpp, sampler_api.cpp, errors.cpp); run by sample_math_test.ts. Exit status 1 on failure.
// Usage: kvr_sample_math_test [auto|generic|avx2|avxvnni|avx512] — the kernel cap the checks run
// under (host/cpu_features.h; default auto), so each exp path this CPU has is checked; exit 2 for
// another argument.
#include "common/sample_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/sampler.h"
#include "host/cpu_features.h"
#include "host/sampling.h"
#include "kvrelay.h"

namespace {

using namespace kvr;

int g_checks = 0, g_failures = 0;

void check(bool ok, const char* what, long long a = 0, long long b = 0) {
  ++g_checks;
  if (!ok && ++g_failures <= 20) std::printf("FAIL %s (%lld vs %lld)\n", what, a, b);
}

// A row with the hazards the selection must order: ties (values on a coarse grid), NaN, -inf,
// and in some rows one to three +inf (the sampler's limit row: they share the probability).
std::vector<float> random_row(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  const bool coarse = pick(rng) < 40;
  std::vector<float> row(n);
  for (float& v : row) {
    const int p = pick(rng);
    if (p < 3) v = std::numeric_limits<float>::quiet_NaN();
    else if (p < 8) v = -std::numeric_limits<float>::infinity();
    else v = coarse ? std::round(u(rng) * 2) / 2 : u(rng);
  }
  if (pick(rng) < 15) {
    const int count = 1 + pick(rng) % 3;
    for (int c = 0; c < count; ++c) row[rng() % n] = std::numeric_limits<float>::infinity();
  }
  if (pick(rng) < 3) std::fill(row.begin(), row.end(), -std::numeric_limits<float>::infinity());
  return row;
}

// Oracle: every selectable id sorted by (value desc, id asc) with std::stable_sort on doubles.
std::vector<int32_t> sorted_ids(const std::vector<float>& row) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < row.size(); ++i)
    if (static_cast<double>(row[i]) > -std::numeric_limits<double>::infinity()) ids.push_back(static_cast<int32_t>(i));
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return static_cast<double>(row[a]) > static_cast<double>(row[b]); });
  return ids;
}

void test_select() {
  std::mt19937 rng(7);
  for (int t = 0; t < 3000; ++t) {
    const size_t n = 1 + rng() % 300, k = 1 + rng() % sm::kMaxCandidates;
    std::vector<float> row = random_row(rng, n);
    if (t % 10 == 0) row[rng() % n] = std::numeric_limits<float>::infinity();  // +inf is selectable
    const std::vector<int32_t> want = sorted_ids(row);
    std::vector<float> vals(k);
    std::vector<int32_t> ids(k);
    const size_t m = select_candidates(row.data(), n, k, vals.data(), ids.data());
    check(m == std::min(k, want.size()), "select_candidates count", static_cast<long long>(m),
          static_cast<long long>(std::min(k, want.size())));
    for (size_t j = 0; j < m && j < want.size(); ++j) {
      check(ids[j] == want[j], "select_candidates id", ids[j], want[j]);
      check(std::memcmp(&vals[j], &row[want[j]], 4) == 0, "select_candidates value");
    }
  }
}

bool same_state(const sm::Xoshiro& a, const sm::Xoshiro& b) { return std::memcmp(a.s, b.s, sizeof a.s) == 0; }

// One configuration of a step: temperature, top_k (>= 1 for the top-k route), top_p, min_p.
kvr_sampling_params random_params(std::mt19937& rng, bool greedy) {
  kvr_sampling_params p;
  kvr_sampling_default_params(&p);
  const double temps[] = {0.3, 0.7, 1.0, 1.5, 4.0};
  const double top_ps[] = {1.0, 1.0, 0.9, 0.5, 0.1};
  const double min_ps[] = {0.0, 0.0, 0.05, 0.3, 1.0};
  p.temperature = greedy ? 0.0 : temps[rng() % 5];
  p.top_k = 1 + rng() % 80;
  p.top_p = top_ps[rng() % 5];
  p.min_p = min_ps[rng() % 5];
  p.seed = static_cast<int64_t>(rng()) - (int64_t{1} << 31);
  return p;
}

void test_route_equivalence() {
  std::mt19937 rng(11);
  int device_steps = 0;
  for (int t = 0; t < 6000; ++t) {
    const size_t n = 1 + rng() % 400;
    const std::vector<float> row = random_row(rng, n);
    const uint32_t width = static_cast<uint32_t>(1 + rng() % n);
    const kvr_sampling_params p = random_params(rng, t % 5 == 0);
    kvr_sampler *full = nullptr, *dev = nullptr;
    if (kvr_sampler_create(&p, &full) != KVR_OK || kvr_sampler_create(&p, &dev) != KVR_OK) {
      check(false, "kvr_sampler_create");
      return;
    }
    const sm::RoutePlan plan = sm::plan_route(p.temperature, p.top_k, width, false);
    const bool device = p.temperature == 0 || std::min<uint32_t>(p.top_k, width) <= sm::kMaxCandidates;
    check((plan.route != sm::Route::kRow) == device, "plan_route sends greedy and top_k <= 64 steps to the device");
    // Several consecutive steps on the same row: the streams must stay in step.
    for (int step = 0; step < 3 && plan.route != sm::Route::kRow; ++step) {
      int32_t tok_full = -7, tok_dev = -7;
      const int32_t st_full = sampler_run(full, row.data(), width, &tok_full, nullptr, nullptr, nullptr, 0, nullptr);
      std::vector<float> vals(plan.k);
      std::vector<int32_t> ids(plan.k);
      const size_t m = select_candidates(row.data(), width, plan.k, vals.data(), ids.data());
      const int32_t st_dev = sampler_run_candidates(dev, plan.route, vals.data(), ids.data(), m, width, &tok_dev);
      check(st_full == st_dev, "candidate route status equals the full-row status", st_dev, st_full);
      if (st_full == KVR_OK) check(tok_full == tok_dev, "candidate route token equals the full-row token", tok_dev, tok_full);
      check(same_state(full->rng.state(), dev->rng.state()), "candidate route leaves the same PRNG state");
      ++device_steps;
    }
    kvr_sampler_free(full);
    kvr_sampler_free(dev);
  }
  check(device_steps > 10000, "enough device-route steps ran", device_steps, 10000);
}

void test_plan() {
  using sm::Route;
  check(sm::plan_route(0.0, 0, 151936, false).route == Route::kGreedy, "greedy at Qwen3's vocab");
  check(sm::plan_route(0.0, 0, 151936, true).route == Route::kRow, "logprobs need the row");
  check(sm::plan_route(0.8, 0, 151936, false).route == Route::kRow, "plain temperature needs the row");
  const sm::RoutePlan k50 = sm::plan_route(0.8, 50, 151936, false);
  check(k50.route == Route::kTopK && k50.k == 50, "top_k 50 on the device", k50.k, 50);
  check(sm::plan_route(0.8, 65, 151936, false).route == Route::kRow, "top_k above 64 needs the row");
  const sm::RoutePlan narrow = sm::plan_route(0.8, 100, 40, false);
  check(narrow.route == Route::kTopK && narrow.k == 40, "top_k capped by the width", narrow.k, 40);
  check(sm::select_fits(151936, 64), "Qwen3 vocab fits 64 candidates");
  check(!sm::select_fits(1u << 23, 64), "a 8M-wide row does not fit 64 candidates in one merge");
  check(sm::plan_route(0.0, 0, 1u << 30, false).route == Route::kRow, "a row too wide for the tiling copies");
  // Tiling arithmetic: segments cover the row exactly.
  for (uint32_t w : {1u, 4095u, 4096u, 4097u, 151936u}) {
    const uint32_t s = sm::select_segments(w);
    check(static_cast<uint64_t>(s) * sm::kSelectSegment >= w && (s - 1) * sm::kSelectSegment < w,
          "select_segments covers the row", s, w);
  }
}

}  // namespace

// A device takes a sampler's step on its candidates only while the sampler leaves the row as the
// model wrote it: a repetition penalty, logit_bias, presence/frequency penalties and a min_tokens
// ban still in force send it to the row route; once min_tokens tokens were drawn the ban is over.
void test_sampler_route() {
  using sm::Route;
  const kvr_sampling_params p{0.8, 1.0, 0.0, 7, 20, 0};
  auto route = [](const kvr_sampler* s) { return sampler_route(*s, 151936, false).route; };
  kvr_sampler* s = nullptr;
  check(kvr_sampler_create(&p, &s) == KVR_OK, "create");
  check(route(s) == Route::kTopK, "top_k 20 alone runs on the device");
  const int32_t stop = 2;
  check(kvr_sampler_set_min_tokens(s, 2, &stop, 1) == KVR_OK, "set_min_tokens");
  check(route(s) == Route::kRow, "a min_tokens ban in force takes the row");
  std::vector<float> row(64, 0.0f);
  int32_t tok = -1;
  for (int i = 0; i < 2; ++i) sampler_run(s, row.data(), row.size(), &tok, nullptr, nullptr, nullptr, 0, nullptr);
  check(route(s) == Route::kTopK, "the ban is over after min_tokens draws");
  const int32_t id = 5;
  const double bias = 1.5;
  check(kvr_sampler_set_logit_bias(s, &id, &bias, 1) == KVR_OK, "set_logit_bias");
  check(route(s) == Route::kRow, "a logit bias takes the row");
  check(kvr_sampler_set_logit_bias(s, nullptr, nullptr, 0) == KVR_OK, "clear the bias");
  check(route(s) == Route::kTopK, "no bias, no row");
  check(kvr_sampler_set_presence_frequency(s, 0.0, 0.5) == KVR_OK, "set_presence_frequency");
  check(route(s) == Route::kRow, "a frequency penalty takes the row");
  check(kvr_sampler_set_presence_frequency(s, 0.0, 0.0) == KVR_OK, "clear the penalties");
  check(kvr_sampler_set_repetition_penalty(s, 1.2, nullptr, 0) == KVR_OK, "set_repetition_penalty");
  check(route(s) == Route::kRow, "a repetition penalty takes the row");
  kvr_sampler_free(s);
}

// js_exp_many (vectorised where the CPU has AVX-512) against the scalar js_exp, bit for bit: random
// arguments over the whole finite range and the sampler's range, the fast path's edges (the
// overflow/subnormal bounds, |x| near 2^-60, table boundaries k = 256 m + j), NaN and infinities,
// and lengths that leave a scalar tail.
void test_exp_many() {
  std::printf("exp path: %s\n", js_exp_many_path());
  std::mt19937_64 rng(7);
  std::vector<double> xs;
  std::uniform_real_distribution<double> wide(-760.0, 720.0), sampler(-60.0, 0.0);
  for (int i = 0; i < 400000; ++i) xs.push_back(wide(rng));
  for (int i = 0; i < 400000; ++i) xs.push_back(sampler(rng));
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, 0x1p-60, -0x1p-60, 0x1p-61, 0x1.fffffffffffffp-61, 709.0, 709.0000000001, -708.0,
                   -708.0000000001, -745.2, 710.0, 1e-300, -1e-300, inf, -inf, std::nan("")})
    xs.push_back(v);
  for (int k = -2000; k <= 2000; ++k) {  // multiples of ln2/256 and their neighbours
    const double x = k * (0.6931471805599453 / 256);
    xs.push_back(x);
    xs.push_back(std::nextafter(x, inf));
    xs.push_back(std::nextafter(x, -inf));
  }
  for (size_t len : {xs.size(), size_t{7}, size_t{9}, size_t{17}}) {
    std::vector<double> got(len);
    js_exp_many(xs.data(), got.data(), len);
    size_t bad = 0;
    for (size_t i = 0; i < len; ++i) {
      const double want = js_exp(xs[i]);
      uint64_t a, b;
      std::memcpy(&a, &got[i], 8);
      std::memcpy(&b, &want, 8);
      if (a != b && !(std::isnan(got[i]) && std::isnan(want))) {
        if (++bad <= 5) std::printf("  js_exp_many(%.17g) = %.17g, js_exp %.17g\n", xs[i], got[i], want);
      }
    }
    check(bad == 0, "js_exp_many equals js_exp bit for bit", static_cast<long long>(bad), 0);
  }
}

int main(int argc, char** argv) {
  static const char* const kCaps[] = {"auto", "generic", "avx2", "avxvnni", "avx512"};
  size_t cap = 0;
  if (argc > 2) return 2;
  if (argc == 2) {
    while (cap < cpu::kKernelCaps && std::strcmp(argv[1], kCaps[cap]) != 0) ++cap;
    if (cap == cpu::kKernelCaps) {
      std::printf("unknown kernel cap %s (auto, generic, avx2, avxvnni or avx512)\n", argv[1]);
      return 2;
    }
  }
  const cpu::KernelScope scope(static_cast<cpu::KernelCap>(cap));
  test_exp_many();
  test_select();
  test_route_equivalence();
  test_plan();
  test_sampler_route();
  std::printf("sample_math: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
