// The CPU forward pass of one sequence over a block of new tokens, through the layer loop
// (cpu/batch_forward.cpp): a decode is a step of one row, a prefill runs in chunks, each a step of
// one sequence. Inputs are validated by the caller.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/kv_cache.h"
#include "cpu/weights.h"

namespace kvr::cpu {

// Per-sequence choice between 1 thread and the model's n_threads for decode steps, by measured
// step time: the first kProbe steps run the two in alternating blocks of kBlock steps (a block's
// first step, which finds the other configuration's caches and a sleeping worker, is not counted;
// a new sequence of a model that has chosen already starts from that choice), the smaller total
// time wins (the mean, not the median: a 2-thread step now and then stalls for a millisecond when
// another process takes a core, and throughput pays for those), and every kReprobeEvery steps the
// comparison is repeated (load from other processes changes which is faster; on an
// oversubscribed machine one thread wins). Results do not depend on the choice.
struct DecodeTuner {
  static constexpr uint32_t kProbe = 16;          // probe steps (half each)
  static constexpr uint32_t kBlock = 4;           // consecutive probe steps of one configuration
  static constexpr uint32_t kReprobeEvery = 256;  // steps between probes
  uint32_t step = 0;       // steps since the last probe began
  int chosen = 0;          // 0 = not chosen yet
  double probe_time[2][kProbe / 2] = {};  // [1 thread, n threads] seconds of the probe steps
};

// Work counters of one stage of a step (cpu/stage_units.h): the units are cut into
// kShares contiguous shares; thread t claims from share t % kShares first (`next[r]` counts claims
// in share r), then from the others; `done` counts finished units (the futex word waiters sleep
// on). Each counter on its own cache line, so owners claiming their own share do not contend.
struct StageCounter {
  static constexpr uint32_t kShares = 4;
  struct alignas(64) Line {
    std::atomic<uint32_t> v{0};
  };
  Line done;
  Line next[kShares];
};

struct BatchScratch;  // cpu/batch_forward.h

// Reusable buffers of one sequence (never shared between sequences).
struct Scratch {
  Scratch();
  ~Scratch();
  std::unique_ptr<BatchScratch> step;  // its steps' buffers and decode tuner (made on first use)
};

// Appends tokens[0..n) at positions pos0..pos0+n-1 to kv (which must have room) and writes
// logits: all_positions ? (n, vocab) rows : the last position's (vocab). tokens are < vocab.
// Throws std::bad_alloc when scratch cannot grow (the cache's length is the caller's to update).
void forward(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
             float* logits, Scratch& scratch);

}  // namespace kvr::cpu
