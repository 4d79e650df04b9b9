// The CPU forward pass of one batched step: several sequences of one model, each appending its
// own new tokens (one for a decode, more for a prefill chunk) to its own KV cache. Every
// projection runs as one GEMM over the rows of all sequences; attention runs per sequence over
// its own cache (in units claimed by the threads: a decode, or a block of a chunk's rows); the
// lm_head runs only for the sequences that want logits. Inputs are validated by the caller.
// The one CPU layer loop: a single sequence's prefill chunk (forward.h) is a step of one
// sequence; a lone decode dispatches to the one-row decode step (decode_step.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/kv_cache.h"
#include "cpu/forward.h"
#include "cpu/weights.h"
#include "host/gemm_prepared.h"

namespace kvr::cpu {

// One sequence of a step: tokens[0..n) go to positions pos0..pos0+n-1 of kv (which holds storage
// for them: kv.held_tokens() >= pos0 + n). logits: where its last row's (vocab) logits go — every
// row's, (n, vocab), when all_rows — or nullptr for none. sampler (with logits): the step may
// sample logits[0..width) into *token_out itself (the draw of kvr_sampler_sample; -1 when the row
// has no finite logit) and then sets `sampled`; else the caller samples.
struct BatchSeq {
  KvCache* kv = nullptr;
  const int32_t* tokens = nullptr;
  size_t n = 0, pos0 = 0;
  float* logits = nullptr;
  bool all_rows = false;
  kvr_sampler* sampler = nullptr;
  uint32_t width = 0;
  int32_t* token_out = nullptr;
  bool sampled = false;
};

// Buffers of a step, reused from step to step by the caller's thread.
struct BatchScratch {
  std::vector<float> main;    // activations of every row
  std::vector<float> attn;    // attention scratch (per thread)
  std::vector<PreparedRows> prepared;  // each thread's prepared GEMM input (few-row steps)
  std::unique_ptr<StageCounter[]> stages;  // work counters of the step's stages (stage_units.h)
  size_t stage_count = 0;
  Scratch single;  // a step of one decode runs the single-sequence decode step (forward.h)
  std::vector<std::unique_ptr<BatchScratch>> groups;  // a step split in groups of sequences: one each
};

// Runs the step (and may sample: see BatchSeq). Sequences must be distinct caches, samplers distinct. Throws std::bad_alloc when scratch cannot
// grow (caches may then hold partial writes at positions >= pos0; lengths are the caller's).
void forward_batch(const ModelGeometry& m, const Weights& w, BatchSeq* seqs, size_t count, BatchScratch& sc);

// The step on `nt` threads in one WorkerPool region of stages (no split in groups): the layer loop
// behind forward_batch and the single-sequence prefill (forward.h). draw: the sequences with a
// sampler are drawn in a last stage of the region (each row one unit); returns whether they were
// (not for a lone decode, which takes the one-row decode step), so the caller marks them sampled.
bool forward_stages(const ModelGeometry& m, const Weights& w, const BatchSeq* seqs, size_t count, BatchScratch& sc,
                    unsigned nt, bool draw = false);

}  // namespace kvr::cpu
