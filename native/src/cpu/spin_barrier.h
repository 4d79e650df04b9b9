// A barrier for the threads of one short parallel region (a decode step): spins for a few
// microseconds (a stage boundary then costs ~100 ns when every thread is running), then sleeps on
// a futex so that on an oversubscribed machine a waiting thread frees its core for the partner it
// waits for instead of burning it. Not a general primitive: one region, a fixed team, every
// thread calls wait() the same number of times.
#pragma once

#include <atomic>
#include <chrono>
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

class SpinBarrier {
 public:
  // Sets the team size; every thread calls it (with the same value) before its first wait().
  void arm(unsigned threads) { n_.store(threads, std::memory_order_relaxed); }

  void wait() {
    const uint32_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_.load(std::memory_order_relaxed)) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_all();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 1;; ++i) {
      if (gen_.load(std::memory_order_acquire) != gen) return;
      pause();
      if (i % 32 == 0 && std::chrono::steady_clock::now() - start > kSpinFor) break;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (gen_.load(std::memory_order_seq_cst) == gen) sleep_while(gen);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  static constexpr std::chrono::microseconds kSpinFor{20};

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  // Blocks while gen_ == expected (returns early on a wake or a spurious wake-up).
  void sleep_while(uint32_t expected) {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen_), FUTEX_WAIT_PRIVATE, expected, nullptr,
            nullptr, 0);
#else
    (void)expected;
    std::this_thread::yield();
#endif
  }
  void wake_all() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&gen_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
#endif
  }

  alignas(64) std::atomic<unsigned> count_{0};
  alignas(64) std::atomic<uint32_t> gen_{0};
  std::atomic<unsigned> sleepers_{0};
  std::atomic<unsigned> n_{1};
  static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word must be 32 bits");
};

}  // namespace kvr::cpu
