// Code-path switches that only the test library can set (kvrelay_test.h, native/src/test_api/):
// each selects a path a test compares with the default one, in-process. The production library
// has no setter, so there they keep their defaults. Read where the path is chosen.
#pragma once

#include <atomic>

namespace kvr::test_switches {

// kvr_projector_apply_seq takes the backend-neutral copy path even for two CPU sequences.
extern std::atomic<bool> project_via_copies;
// BF16 checkpoint weights are widened to f32 at load (the kernels' other input path).
extern std::atomic<bool> weights_f32;
// A batched step's host draws run one after another on the calling thread after the step (not in
// the CPU step's last stage, cpu/batch_forward.cpp; not over the pool, batch.cpp draw_rows).
extern std::atomic<bool> serial_draws;

}  // namespace kvr::test_switches
