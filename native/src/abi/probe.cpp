// kvr_backend_probe and the backend/device checks (probe.h): the CPU answers with its
// description; CUDA asks cuda_probe (the CUDA backend, or the stub of a build without CUDA).
#include "core/probe.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/backend.h"
#include "core/errors.h"
#include "host/cpu_features.h"
#include "kvrelay.h"

namespace kvr {

int32_t check_backend_device(uint32_t backend, uint32_t device) {
  if (backend != KVR_BACKEND_CPU && backend != KVR_BACKEND_CUDA)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("backend %u is not a kvr_backend (0 cpu, 1 cuda)", backend));
  if (backend == KVR_BACKEND_CPU && device != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("device %u: the cpu backend has only device 0", device));
  if (device > 0x7fffffffu)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("device %u exceeds a CUDA device ordinal (< 2^31)", device));
  return KVR_OK;
}

void copy_info(const std::string& s, char* info, size_t info_len) {
  if (info == nullptr || info_len == 0) return;
  const size_t n = std::min(s.size(), info_len - 1);
  std::memcpy(info, s.data(), n);
  info[n] = 0;
}

}  // namespace kvr

extern "C" {

KVR_API int32_t kvr_backend_probe(uint32_t backend, int32_t device, char* info, size_t info_len) {
  if (info == nullptr && info_len > 0) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "info is NULL but info_len > 0");
  kvr::copy_info("", info, info_len);
  try {
    if (device < 0) {
      const std::string msg = kvr::format("device %d must be >= 0", device);
      kvr::copy_info(msg, info, info_len);
      return kvr::fail(KVR_ERR_INVALID_ARGUMENT, msg);
    }
    if (int32_t st = kvr::check_backend_device(backend, static_cast<uint32_t>(device))) {
      kvr::copy_info(kvr_last_error(), info, info_len);
      return st;
    }
    std::string text;
    int32_t st = KVR_OK;
    if (backend == KVR_BACKEND_CPU) text = kvr::cpu::cpu_description();
    else st = kvr::cuda_probe(device, text);
    kvr::copy_info(text, info, info_len);
    return st == KVR_OK ? KVR_OK : kvr::fail(st, text);
  } catch (...) {
    kvr::copy_info("out of memory while probing", info, info_len);
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "out of memory while probing");
  }
}

}  // extern "C"
