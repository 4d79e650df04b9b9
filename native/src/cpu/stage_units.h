// Stages of units of work for the threads of one WorkerPool region (the layer loop,
// cpu/batch_forward.cpp): every thread calls run_stage for every stage in the same order; each
// claims units — its own share first (the same
// units every step, so their weights stay in its core's cache), then what is left of the others' —
// and then waits until every unit of the stage is FINISHED (not until every thread arrives), so a
// thread the OS takes off its core holds up at most the unit it is in: the partner takes the rest.
// Counters: StageCounter (cpu/forward.h). Not a task system.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "cpu/forward.h"
#include "host/futex.h"

namespace kvr::cpu {

// Waiters spin this long for a stage's last unit before sleeping on its done counter: units are
// tens of microseconds, and a spinner keeps its core from a partner the OS has preempted.
constexpr int kStageSpinMicros = 20;

// Runs unit(u) for every unit of stage `s` (units [0, total)) that thread t of `team` claims,
// then returns once all `total` are finished. `sleepers` is shared by the region's threads.
// unit must not throw.
template <typename Unit>
void run_stage(StageCounter& s, uint32_t total, unsigned t, unsigned team, std::atomic<uint32_t>& sleepers,
               Unit&& unit) {
  std::atomic<uint32_t>& done = s.done.v;
  const uint32_t shares = std::min<uint32_t>(std::max(team, 1u), StageCounter::kShares);
  for (uint32_t k = 0; k < shares; ++k) {
    const uint32_t r = (t + k) % shares;
    const uint32_t begin = static_cast<uint32_t>(uint64_t{total} * r / shares);
    const uint32_t end = static_cast<uint32_t>(uint64_t{total} * (r + 1) / shares);
    for (uint32_t u = begin + s.next[r].v.fetch_add(1, std::memory_order_relaxed); u < end;
         u = begin + s.next[r].v.fetch_add(1, std::memory_order_relaxed)) {
      unit(u);
      if (done.fetch_add(1, std::memory_order_seq_cst) + 1 == total && sleepers.load(std::memory_order_seq_cst) > 0)
        futex_wake_all(&done);
    }
  }
  if (done.load(std::memory_order_acquire) == total) return;
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1; done.load(std::memory_order_acquire) != total; ++i) {
    cpu_pause();
    if (i % 32 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(kStageSpinMicros)) {
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      for (uint32_t d; (d = done.load(std::memory_order_seq_cst)) != total;) futex_wait(&done, d);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      break;
    }
  }
}

}  // namespace kvr::cpu
