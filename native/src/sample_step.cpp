// The default sampling decode step of the backend seam (Backend::forward_sample, backend.h): the
// forward pass writes the last logits row to host memory and the CPU sampler (sampling.cpp) picks
// from it. Backends that can keep the row on their device override it (cuda_backend.cpp).
#include "backend.h"
#include "sampler.h"

namespace kvr {

int32_t Backend::forward_sample(SeqState& s, int32_t token, size_t pos0, const SampleRequest& r,
                                float* spare) const {
  forward(s, &token, 1, pos0, false, spare);
  return sampler_run(r.sampler, spare, r.width, r.token_out, r.logprob_out, r.top_ids, r.top_logprobs, r.top_len,
                     r.top_count_out);
}

}  // namespace kvr
