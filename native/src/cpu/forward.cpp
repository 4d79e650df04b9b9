// CPU forward pass of one sequence (see forward.h): a decode is the one-row decode step
// (cpu/decode_step.h); a prefill runs in chunks of up to kChunk tokens (bounded scratch), each a
// step of one sequence through the batched layer loop (cpu/batch_forward.h), so prefill, decode
// and batched steps share one layer recipe.
#include "cpu/forward.h"

#include <algorithm>

#include "cpu/batch_forward.h"
#include "cpu/decode_step.h"

namespace kvr::cpu {
namespace {

constexpr size_t kChunk = 256;  // tokens per prefill chunk

}  // namespace

Scratch::Scratch() = default;
Scratch::~Scratch() = default;

void forward(const ModelGeometry& m, const Weights& w, KvCache& kv, const int32_t* tokens, size_t n, size_t pos0, bool all_positions,
             float* logits, Scratch& scratch) {
  if (n == 1) {  // decode: one parallel region for the whole step (cpu/decode_step.cpp)
    decode_tuned(m, w, kv, tokens[0], pos0, logits, scratch, scratch.tuner);
    return;
  }
  if (!scratch.prefill) scratch.prefill = std::make_unique<BatchScratch>();
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
    forward_stages(m, w, &s, 1, *scratch.prefill, nt);
  }
}

}  // namespace kvr::cpu
