// The CPU forward pass of one batched step: several sequences of one model, each appending its
// own new tokens (one for a decode, more for a prefill chunk) to its own KV cache. Every
// projection runs as one GEMM over the rows of all sequences; attention runs per sequence over
// its own cache (in units claimed by the threads: a decode, or a block of a chunk's rows); the
// lm_head runs only for the sequences that want logits. Inputs are validated by the caller.
// The one CPU layer loop: a single sequence's prefill chunk (forward.h) is a step of one
// sequence, and a decode a step of one row (its thread count tuned: decode_tuned).
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

// Rows [r0, r1) of sequence `seq`'s new tokens, kv head g's group of query heads (a prefill
// block) or every head (g = kAllHeads: a decode row): one unit of attention work.
constexpr size_t kAllHeads = ~size_t{0};
struct AttnUnit {
  size_t seq, r0, r1, g;
};

// One run of compacted final-norm rows [row0, row0 + len) whose logits go to dst (contiguous).
struct HeadRun {
  size_t row0, len;
  float* dst;
};

// Where a step's rows and work go (batch_forward.cpp), kept between steps so a step allocates
// nothing once the buffers have grown.
struct StepPlan {
  std::vector<size_t> row0;               // first row of each sequence
  std::vector<size_t> seq_of, pos_of;     // each row's sequence and position
  std::vector<AttnUnit> units, decodes;   // attention units; the decode rows among them
  std::vector<size_t> want_rows;          // rows whose logits are wanted, in logits order
  std::vector<HeadRun> runs;              // lm_head runs over them
  std::vector<size_t> draws;              // sequences drawn in the step's last stage
};

// Buffers of a step, reused from step to step by the caller's thread.
struct BatchScratch {
  StepPlan plan;
  // Cache-line aligned: the threads write neighbouring column chunks of these rows and their own
  // slices (one row: each thread's normed copy, its attention scratch), which would otherwise
  // share lines at every boundary.
  std::vector<float, AlignedAllocator<float>> main;  // activations of every row
  std::vector<float, AlignedAllocator<float>> attn;  // attention scratch (per thread)
  std::vector<PreparedRows> prepared;  // each thread's prepared GEMM input (few-row steps)
  std::unique_ptr<StageCounter[]> stages;  // work counters of the step's stages (stage_units.h)
  size_t stage_count = 0;
  DecodeTuner tuner;  // thread count of this scratch's lone decodes (decode_tuned)
  std::vector<std::unique_ptr<BatchScratch>> groups;  // a step split in groups of sequences: one each
};

// Runs the step (and may sample: see BatchSeq). Sequences must be distinct caches, samplers distinct. Throws std::bad_alloc when scratch cannot
// grow (caches may then hold partial writes at positions >= pos0; lengths are the caller's).
void forward_batch(const ModelGeometry& m, const Weights& w, BatchSeq* seqs, size_t count, BatchScratch& sc);

// The step on `nt` threads in one WorkerPool region of stages (no split in groups): the layer loop
// behind forward_batch and the single-sequence forward (forward.h). A step of one row (a decode)
// takes its one-row units inside the same stages (batch_forward.cpp); its result is bit-identical
// for every nt. draw: the sequences with a sampler and a logits row are drawn in a last stage of
// the region (each row one unit), so the caller marks them sampled. Returns the thread count used
// (1 when another step holds the pool).
unsigned forward_stages(const ModelGeometry& m, const Weights& w, const BatchSeq* seqs, size_t count, BatchScratch& sc,
                        unsigned nt, bool draw = false);

// A step of one decode row (s.n == 1) through forward_stages on the thread count sc.tuner
// chooses (DecodeTuner, forward.h): 1 or the model's n_threads, by measured step time.
void decode_tuned(const ModelGeometry& m, const Weights& w, const BatchSeq& s, BatchScratch& sc);

}  // namespace kvr::cpu
