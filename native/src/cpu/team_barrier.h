// A barrier for the threads of one WorkerPool region (cpu/worker_pool.h): the stage boundaries of
// the batched step (cpu/batch_forward.cpp). Spins briefly (stages are tens of microseconds), then
// sleeps on a futex so a waiting thread gives its core back to a partner the OS has preempted.
// Not a general barrier: the team size is passed to every wait and must be the same for all.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "cpu/futex.h"

namespace kvr::cpu {

class TeamBarrier {
 public:
  // Spin this long for the last arrival before sleeping.
  static constexpr int kSpinMicros = 30;

  // Returns once all `team` threads have called wait() for this round.
  void wait(unsigned team) {
    if (team <= 1) return;
    // gen_ cannot move before this thread arrives (the round needs every thread), so the value
    // read here is this round's.
    const uint32_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == team) {
      count_.store(0, std::memory_order_relaxed);  // before the release: nobody has left yet
      gen_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&gen_);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (unsigned i = 1; gen_.load(std::memory_order_acquire) == gen; ++i) {
      cpu_pause();
      if (i % 32 == 0 &&
          std::chrono::steady_clock::now() - start > std::chrono::microseconds(kSpinMicros)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (gen_.load(std::memory_order_seq_cst) == gen) futex_wait(&gen_, gen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        break;
      }
    }
  }

 private:
  alignas(64) std::atomic<uint32_t> count_{0};
  alignas(64) std::atomic<uint32_t> gen_{0};  // the futex word
  std::atomic<uint32_t> sleepers_{0};
};

}  // namespace kvr::cpu
