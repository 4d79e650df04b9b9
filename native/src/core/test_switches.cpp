// The code-path switches of test_switches.h, off by default.
#include "core/test_switches.h"

namespace kvr::test_switches {

std::atomic<bool> project_via_copies{false};
std::atomic<bool> serial_draws{false};
std::atomic<bool> weights_f32{false};

}  // namespace kvr::test_switches
