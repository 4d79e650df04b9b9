// Sampling math shared by the CPU sampler (sampling.cpp) and the CUDA sampling step (sample.cu,
// cuda_backend.cpp) as __host__ __device__ inline functions: the xoshiro128** stream of
// lib/engine/prng.ts, the candidate order (logit descending, id ascending), the tiling of the
// device's top-k selection and the route a sampling step takes on a device. Unit-tested by g++
// (sample_math_test.cpp). Not the float64 draw itself (sampling.cpp: it needs V8's exp).
#pragma once

#include <cstdint>

#include "common/device_math.h"  // KVR_HD

namespace kvr::sm {

// ---- xoshiro128** seeded through splitmix32 (lib/engine/prng.ts) ----
struct Xoshiro {
  uint32_t s[4];
};

KVR_HD uint32_t rotl32(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

// The seed's low and high 32-bit words (two's complement, hi = floor(seed / 2³²)) mixed by
// splitmix32; an all-zero state becomes s[0] = 1.
KVR_HD Xoshiro xoshiro_seed(int64_t seed) {
  const uint32_t lo = static_cast<uint32_t>(static_cast<uint64_t>(seed));
  const uint32_t hi = static_cast<uint32_t>(static_cast<uint64_t>(seed >> 32));
  uint32_t x = lo ^ (hi * 0x9e3779b9u);
  Xoshiro r{};
  for (int i = 0; i < 4; ++i) {
    x += 0x9e3779b9u;
    uint32_t z = x;
    z = (z ^ (z >> 16)) * 0x85ebca6bu;
    z = (z ^ (z >> 13)) * 0xc2b2ae35u;
    r.s[i] = z ^ (z >> 16);
  }
  if ((r.s[0] | r.s[1] | r.s[2] | r.s[3]) == 0) r.s[0] = 1;
  return r;
}

KVR_HD uint32_t xoshiro_next(Xoshiro& x) {
  const uint32_t result = rotl32(x.s[1] * 5, 7) * 9;
  const uint32_t t = x.s[1] << 9;
  x.s[2] ^= x.s[0];
  x.s[3] ^= x.s[1];
  x.s[1] ^= x.s[2];
  x.s[0] ^= x.s[3];
  x.s[2] ^= t;
  x.s[3] = rotl32(x.s[3], 11);
  return result;
}

// 53 random bits in [0, 1): 27 high bits of one draw, 26 of the next (exact in double).
KVR_HD double xoshiro_double(Xoshiro& x) {
  const uint32_t hi = xoshiro_next(x) >> 5;
  const uint32_t lo = xoshiro_next(x) >> 6;
  return (static_cast<double>(hi) * 67108864.0 + lo) / 9007199254740992.0;
}

// ---- candidate order ----
// a before b: larger logit first, equal logits by lower id (sampler.ts: l[b] - l[a] || a - b).
// Callers keep NaN and -inf out of candidate sets (they are never selected).
KVR_HD bool before(float va, int32_t a, float vb, int32_t b) { return va > vb || (va == vb && a < b); }

// A logit that can be a candidate: above -inf (NaN is not).
KVR_HD bool selectable(float v) { return v > -__builtin_huge_valf(); }

// ---- the device's top-k selection (sample.cu) ----
// Pass 1: one block of kSelectThreads threads per segment of kSelectSegment logits keeps its
// segment's best k; pass 2: one block selects the best k of all segments' (segments · k <=
// kSelectSegment). k <= kMaxCandidates.
constexpr uint32_t kSelectThreads = 1024, kSelectItems = 4, kSelectSegment = kSelectThreads * kSelectItems;
constexpr uint32_t kMaxCandidates = 64;

KVR_HD uint32_t select_segments(uint32_t width) { return (width + kSelectSegment - 1) / kSelectSegment; }
// Whether one two-pass selection of k candidates over `width` logits fits the kernel's tiling.
KVR_HD bool select_fits(uint32_t width, uint32_t k) {
  return width >= 1 && k >= 1 && k <= kMaxCandidates &&
         static_cast<uint64_t>(select_segments(width)) * k <= kSelectSegment;
}

// ---- where a decode step's sampling runs on a device ----
// kGreedy: the device's argmax is the token. kTopK: the device keeps the best k = min(top_k,
// width) logits and the float64 draw runs on those k (the CPU sampler's result depends only on
// them: sampling.cpp sample_candidates). kRow: the whole row is needed — plain temperature,
// top-p or min-p without top-k (the draw sums exp over every logit in id order), logprobs (their
// float64 log-sum-exp over the row) — so the row is copied and the CPU sampler runs.
enum class Route : uint32_t { kGreedy = 0, kTopK = 1, kRow = 2 };

struct RoutePlan {
  Route route = Route::kRow;
  uint32_t k = 0;  // candidates the device selects (1 for greedy)
};

KVR_HD RoutePlan plan_route(double temperature, uint32_t top_k, uint32_t width, bool want_logprobs) {
  RoutePlan p;
  if (want_logprobs || width == 0) return p;
  if (temperature == 0) {
    if (select_fits(width, 1)) p.route = Route::kGreedy, p.k = 1;
    return p;
  }
  const uint32_t k = top_k < width ? top_k : width;
  if (top_k >= 1 && select_fits(width, k)) p.route = Route::kTopK, p.k = k;
  return p;
}

}  // namespace kvr::sm
