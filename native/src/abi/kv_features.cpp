// C ABI of the cache ↔ feature block transforms (kvrelay.h kvr_kv_to_features /
// kvr_kv_from_features): checks the geometry and buffers, then strips or re-applies RoPE on the
// keys and transposes (host/projection_kernels.h). Not the ridge fit (ridge.cpp) nor the projector.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "abi/projection_checks.h"
#include "host/projection_kernels.h"
#include "host/rope.h"
#include "kvrelay.h"

namespace {

using namespace kvr::proj;

int32_t transform(const char* fn, bool to_features, const kvr_model_params* geometry,
                  uint32_t start_pos, uint32_t tokens, const float* k_in, size_t k_in_len,
                  const float* v_in, size_t v_in_len, float* k_out, size_t k_out_len,
                  float* v_out, size_t v_out_len) {
  kvr::cpu::KvGeometry g;
  KVR_TRY(check_geometry(fn, "geometry", geometry, &g));
  size_t n = 0;
  KVR_TRY(block_elems(fn, g, tokens, &n));
  if (static_cast<uint64_t>(start_pos) + tokens > (uint64_t{1} << 32))
    return fail(KVR_ERR_OUT_OF_RANGE,
                format("%s: start_pos %u + tokens %u exceeds 2^32", fn, start_pos, tokens));
  KVR_TRY(check_buf(fn, "k_in", k_in, k_in_len, n));
  KVR_TRY(check_buf(fn, "v_in", v_in, v_in_len, n));
  KVR_TRY(check_buf(fn, "k_out", k_out, k_out_len, n));
  KVR_TRY(check_buf(fn, "v_out", v_out, v_out_len, n));
  return guarded(fn, nullptr, [&] {
    const std::vector<double> freq = kvr::rope_inv_freq(*geometry);
    const std::vector<double> none;
    const int nt = std::max(1, omp_get_num_procs());
    if (to_features) {
      kvr::cpu::cache_to_features(g, freq, start_pos, tokens, k_in, k_out, nt);
      kvr::cpu::cache_to_features(g, none, start_pos, tokens, v_in, v_out, nt);
    } else {
      kvr::cpu::features_to_cache(g, freq, start_pos, tokens, k_in, k_out, nt);
      kvr::cpu::features_to_cache(g, none, start_pos, tokens, v_in, v_out, nt);
    }
    return static_cast<int32_t>(KVR_OK);
  });
}

}  // namespace

extern "C" {

KVR_API int32_t kvr_kv_to_features(const kvr_model_params* geometry, uint32_t start_pos,
                                   uint32_t tokens, const float* k_in, size_t k_in_len,
                                   const float* v_in, size_t v_in_len, float* k_out,
                                   size_t k_out_len, float* v_out, size_t v_out_len) {
  return transform("kvr_kv_to_features", true, geometry, start_pos, tokens, k_in, k_in_len, v_in,
                   v_in_len, k_out, k_out_len, v_out, v_out_len);
}

KVR_API int32_t kvr_kv_from_features(const kvr_model_params* geometry, uint32_t start_pos,
                                     uint32_t tokens, const float* k_in, size_t k_in_len,
                                     const float* v_in, size_t v_in_len, float* k_out,
                                     size_t k_out_len, float* v_out, size_t v_out_len) {
  return transform("kvr_kv_from_features", false, geometry, start_pos, tokens, k_in, k_in_len,
                   v_in, v_in_len, k_out, k_out_len, v_out, v_out_len);
}

}  // extern "C"
