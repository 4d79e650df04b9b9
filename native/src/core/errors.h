// Error reporting shared by every C ABI entry point: a thread-local last-error message and
// helpers that format a message and return the status in one step. No exception leaves here.
// Not the status enum itself (that is kvr_status in kvrelay.h).
#pragma once

#include <cstdint>
#include <string>

namespace kvr {

// printf-style formatting into a std::string (messages quote the offending values).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Records msg as this thread's kvr_last_error() and returns status (for `return fail(...)`).
int32_t fail(int32_t status, const std::string& msg);

// Name of a kvr_status value ("KVR_ERR_CAPACITY"), for messages and logs.
const char* status_name(int32_t status);

}  // namespace kvr
