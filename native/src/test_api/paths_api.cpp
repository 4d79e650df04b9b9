// Test exports of production entry points on their other code path (kvrelay_test.h
// kvr_test_projector_apply_seq_via_copies, kvr_test_batch_step_sample_serial; abi/test_paths.h).
#include "abi/test_paths.h"
#include "kvrelay_test.h"

extern "C" {

KVR_API int32_t kvr_test_projector_apply_seq_via_copies(const kvr_projector* projector, const kvr_seq* src,
                                                        kvr_seq* dst, uint32_t n_tokens, uint32_t n_threads) {
  return kvr::projector_apply_seq(projector, src, dst, n_tokens, n_threads, true);
}

KVR_API int32_t kvr_test_batch_step_sample_serial(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens,
                                                  const int32_t* tokens, size_t tokens_len,
                                                  const uint32_t* want_logits, float* logits_out,
                                                  size_t logits_len, kvr_sampler* const* samplers,
                                                  const uint32_t* widths, int32_t* tokens_out) {
  return kvr::batch_step_guarded(seqs, n_seqs, n_tokens, tokens, tokens_len, want_logits, logits_out, logits_len,
                                 samplers, widths, tokens_out, true);
}

}  // extern "C"
