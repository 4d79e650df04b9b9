// Thread-local last-error storage behind kvr_last_error(), message formatting, and
// kvr_abi_version(). Sequences keep their own copy of the message (see sequence.cpp).
#include "core/errors.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

#include "kvrelay.h"

namespace kvr {
namespace {
thread_local std::string t_last_error;
}  // namespace

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out;
  if (n > 0) {
    std::vector<char> buf(static_cast<size_t>(n) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, ap2);
    out.assign(buf.data(), static_cast<size_t>(n));
  }
  va_end(ap2);
  return out;
}

int32_t fail(int32_t status, const std::string& msg) {
  try {
    t_last_error = msg;
  } catch (...) {
    t_last_error.clear();  // out of memory while recording: keep the status, drop the text
  }
  return status;
}

const char* status_name(int32_t status) {
  switch (status) {
    case KVR_OK: return "KVR_OK";
    case KVR_ERR_INVALID_ARGUMENT: return "KVR_ERR_INVALID_ARGUMENT";
    case KVR_ERR_OUT_OF_RANGE: return "KVR_ERR_OUT_OF_RANGE";
    case KVR_ERR_CAPACITY: return "KVR_ERR_CAPACITY";
    case KVR_ERR_IO: return "KVR_ERR_IO";
    case KVR_ERR_UNSUPPORTED: return "KVR_ERR_UNSUPPORTED";
    case KVR_ERR_OUT_OF_MEMORY: return "KVR_ERR_OUT_OF_MEMORY";
    case KVR_ERR_CORRUPT: return "KVR_ERR_CORRUPT";
    case KVR_ERR_INTERNAL: return "KVR_ERR_INTERNAL";
    case KVR_ERR_CHECKSUM: return "KVR_ERR_CHECKSUM";
    case KVR_ERR_POOL_EXHAUSTED: return "KVR_ERR_POOL_EXHAUSTED";
    default: return "KVR_ERR_UNKNOWN";
  }
}

}  // namespace kvr

extern "C" {

KVR_API uint32_t kvr_abi_version(void) { return KVR_ABI_VERSION; }

KVR_API const char* kvr_last_error(void) { return kvr::t_last_error.c_str(); }

}  // extern "C"
