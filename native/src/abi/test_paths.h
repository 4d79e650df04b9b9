// Entry points with the code path as an explicit argument: the production ABI calls them with its
// default path, the test library (kvrelay_test.h, native/src/test_api/paths_api.cpp) with the
// other one, so a test compares the two in-process without any process-wide switch.
#pragma once

#include <cstdint>
#include <cstddef>

#include "kvrelay.h"

namespace kvr {

// kvr_batch_step_sample; serial_draws: the rows to sample come back from the backend as logits
// rows and are drawn one after another on the calling thread after the step (the oracle of the
// draws inside the CPU step and over the pool).
int32_t batch_step_guarded(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                           size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len,
                           kvr_sampler* const* samplers, const uint32_t* widths, int32_t* tokens_out,
                           bool serial_draws);

// kvr_projector_apply_seq; via_copies: the backend-neutral copy path even for two CPU sequences
// (the oracle of the in-place CPU projection).
int32_t projector_apply_seq(const kvr_projector* projector, const kvr_seq* src, kvr_seq* dst, uint32_t n_tokens,
                            uint32_t n_threads, bool via_copies);

}  // namespace kvr
