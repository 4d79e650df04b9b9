// One decode step (a single new token) of the CPU forward pass, run as ONE parallel region (on a
// persistent worker pool, host/worker_pool.h) with stage barriers instead of a fork/join per GEMV:
// the per-token overhead path of docs/native.md "Decode step": the layer loop's dispatch for one
// row alone (cpu/batch_forward.h runs every other step).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.h"
#include "core/kv_cache.h"
#include "cpu/forward.h"
#include "cpu/weights.h"

namespace kvr::cpu {

// Decode through the tuner: picks the thread count, runs decode_step, records the time.
void decode_tuned(const ModelGeometry& m, const Weights& w, KvCache& kv, int32_t token, size_t pos, float* logits, Scratch& sc,
                  DecodeTuner& tuner);

// Appends `token` at position pos (kv has room) and writes its logits (vocab) — the contract of
// forward(m, w, kv, &token, 1, pos, false, logits, scratch). Runs on n_threads threads (>= 1); the
// result is bit-identical for every n_threads (each output is summed by one thread in a fixed
// order; attention uses one key segment). Throws std::bad_alloc when scratch cannot grow. The
// threads are the caller and the workers of WorkerPool::shared(); when another step holds the
// pool the step runs on the caller alone. Returns the thread count used.
unsigned decode_step(const ModelGeometry& m, const Weights& w, KvCache& kv, int32_t token, size_t pos, float* logits,
                     Scratch& sc, int n_threads);

}  // namespace kvr::cpu
