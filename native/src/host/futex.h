// futex wait/wake on a 32-bit atomic and the spin-loop pause: the sleeping half of the spin-then-
// sleep waits of the layer loop's stages (cpu/stage_units.h) and its worker pool (worker_pool.cpp).
// Elsewhere than Linux the wait degrades to a yield (callers re-check in a loop).
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvr::cpu {

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Blocks while *word == expected (may return early: callers loop).
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word must be 32 bits");
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::yield();
#endif
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
#else
  (void)word;
#endif
}

}  // namespace kvr::cpu
