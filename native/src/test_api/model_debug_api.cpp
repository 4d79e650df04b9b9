// Test exports of a model's backend debug switches (kvrelay_test.h kvr_model_set_debug), for the
// GPU check.
#include "core/errors.h"
#include "core/model.h"
#include "kvrelay_test.h"

extern "C" {

KVR_API int32_t kvr_model_set_debug(kvr_model* model, uint32_t flags) {
  if (!model) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  constexpr uint32_t kKnown = KVR_DEBUG_FALLBACK_GEMM | KVR_DEBUG_SYNC_LAUNCHES;
  if (flags & ~kKnown)
    return kvr::fail(KVR_ERR_INVALID_ARGUMENT,
                     kvr::format("debug flags 0x%x: unknown bits 0x%x (known: 0x%x)", flags, flags & ~kKnown, kKnown));
  model->m->backend->set_debug(flags);
  return KVR_OK;
}

}  // extern "C"
