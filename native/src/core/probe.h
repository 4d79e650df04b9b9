// Backend selection checks shared by kvr_model_load and kvr_backend_probe: which kvr_backend /
// device pairs are well-formed, and copying a description into a caller's char buffer. Not the
// probes themselves (host/cpu_features.cpp, cuda/ or stub/cuda_stub.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvr {

// KVR_OK, or KVR_ERR_INVALID_ARGUMENT (recorded as the last error) for an unknown backend, a
// CPU device other than 0, or a CUDA device >= 2^31.
int32_t check_backend_device(uint32_t backend, uint32_t device);

// Copies s into info (info_len bytes; nothing when 0), truncated to info_len - 1, NUL-terminated.
void copy_info(const std::string& s, char* info, size_t info_len);

}  // namespace kvr
