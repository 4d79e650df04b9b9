// CPU forward pass of one sequence (see forward.h): a decode is a step of one row and a prefill
// runs in chunks of up to kChunk tokens (bounded scratch), each a step of one sequence, both
// through the one layer loop (cpu/batch_forward.h). Also the decode thread-count tuner
// (decode_tuned), which lone decodes of a batched step use too.
#include "cpu/forward.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "cpu/batch_forward.h"

namespace kvr::cpu {
namespace {

constexpr size_t kChunk = 256;  // tokens per prefill chunk

// The last tuner choice per model (keyed by Weights::uid). choice != 0 stores (a fresh probe);
// choice == 0 looks up for a new sequence: returns the stored choice, or 0 — probe — when none is
// stored or kReprobeSequences sequences have started from it since its probe (one unlucky probe,
// e.g. a stalled step on a busy machine, would otherwise decide every later short sequence of the
// model: measured, q4 tiny-balanced ran 1 thread at 0.95x the 1-thread mean where forced 2
// threads gave 1.13x).
int shared_choice(uint64_t model, int choice) {
  constexpr uint32_t kReprobeSequences = 4;
  struct Entry {
    int choice;
    uint32_t uses;
  };
  static std::mutex mu;
  static std::unordered_map<uint64_t, Entry> last;
  std::lock_guard<std::mutex> lock(mu);
  if (choice != 0) {
    if (last.size() > 64) last.clear();  // bounded: models come and go
    last[model] = {choice, 0};
    return choice;
  }
  const auto it = last.find(model);
  if (it == last.end() || ++it->second.uses > kReprobeSequences) return 0;
  return it->second.choice;
}

}  // namespace

Scratch::Scratch() = default;
Scratch::~Scratch() = default;

void decode_tuned(const ModelGeometry& m, const Weights& w, const BatchSeq& s, BatchScratch& sc) {
  DecodeTuner& tu = sc.tuner;
  const int many = std::max(m.n_threads, 1);
  if (many == 1) {
    forward_stages(m, w, &s, 1, sc, 1);
    return;
  }
  constexpr uint32_t half = DecodeTuner::kProbe / 2;
  if (tu.step == 0 && tu.chosen == 0) {
    // A new sequence starts from the model's last measured choice (a short generation would
    // otherwise spend most of its steps probing; every few sequences probe afresh, see
    // shared_choice) and probes again after kReprobeEvery steps.
    const int shared = shared_choice(w.uid, 0);
    if (shared != 0) {
      tu.chosen = shared;
      tu.step = DecodeTuner::kProbe;
    }
  }
  const bool probing = tu.step < DecodeTuner::kProbe;
  constexpr uint32_t kBlock = DecodeTuner::kBlock;
  const uint32_t block = tu.step / kBlock;
  const int variant = probing ? static_cast<int>(block % 2) : (tu.chosen == 1 ? 0 : 1);
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned want = variant == 0 ? 1 : static_cast<unsigned>(many);
  const unsigned used = forward_stages(m, w, &s, 1, sc, want);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A step that ran alone because another sequence held the pool says nothing about the choice:
  // it is not counted, and the probe step is repeated.
  if (probing && used != want) return;
  if (probing) {
    tu.probe_time[variant][(block / 2) * kBlock + tu.step % kBlock] = dt;
    if (tu.step + 1 == DecodeTuner::kProbe) {
      double total[2] = {0, 0};  // the mean, not the median: stalls cost throughput
      for (int v = 0; v < 2; ++v)
        for (uint32_t i = 0; i < half; ++i)
          if (i % kBlock != 0) total[v] += tu.probe_time[v][i];  // a block's first step: warm-up
      tu.chosen = total[1] < total[0] ? many : 1;
      shared_choice(w.uid, tu.chosen);
    }
  }
  if (++tu.step >= DecodeTuner::kReprobeEvery) tu.step = 0;
}

void forward(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
             float* logits, Scratch& scratch) {
  if (!scratch.step) scratch.step = std::make_unique<BatchScratch>();
  const unsigned nt = static_cast<unsigned>(std::max(m.n_threads, 1));
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t nc = std::min(kChunk, n - c);
    BatchSeq s;
    s.kv = &kv;
    s.tokens = tokens + c;
    s.n = nc;
    s.pos0 = pos0 + c;
    s.all_rows = all_positions;
    if (all_positions) {
      s.logits = logits + c * m.vocab;
    } else if (c + nc == n) {
      s.logits = logits;
    }
    if (n == 1) {
      decode_tuned(m, w, s, *scratch.step);
    } else {
      forward_stages(m, w, &s, 1, *scratch.step, nt);
    }
  }
}

}  // namespace kvr::cpu
