// Test exports of the code-path switches (kvrelay_test.h kvr_test_set_*, test_switches.h).
#include "core/errors.h"
#include "core/test_switches.h"
#include "kvrelay_test.h"

namespace {

int32_t set_switch(std::atomic<bool>& s, uint32_t on, const char* fn) {
  if (on > 1) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, kvr::format("%s: on must be 0 or 1, got %u", fn, on));
  s.store(on == 1, std::memory_order_relaxed);
  return KVR_OK;
}

}  // namespace

extern "C" {

KVR_API int32_t kvr_test_set_project_via_copies(uint32_t on) {
  return set_switch(kvr::test_switches::project_via_copies, on, "kvr_test_set_project_via_copies");
}

KVR_API int32_t kvr_test_set_weights_f32(uint32_t on) {
  return set_switch(kvr::test_switches::weights_f32, on, "kvr_test_set_weights_f32");
}

KVR_API int32_t kvr_test_set_serial_draws(uint32_t on) {
  return set_switch(kvr::test_switches::serial_draws, on, "kvr_test_set_serial_draws");
}

}  // extern "C"
