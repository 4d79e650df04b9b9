// WorkerPool (see worker_pool.h). Protocol: the caller publishes (job, ctx, team), sets pending_ to
// the number of workers and bumps gen_; every worker, in the team or not, acknowledges every
// generation by decrementing pending_ (so no worker can read the fields of a region that has not
// been published yet); the caller runs its share and returns once pending_ is 0.
#include "cpu/worker_pool.h"

#include <chrono>
#include <system_error>

#include "cpu/futex.h"

namespace kvr::cpu {

WorkerPool& WorkerPool::shared() {
  // Never destroyed: workers may be asleep in a futex when the process exits.
  static WorkerPool* pool = new WorkerPool();
  return *pool;
}

bool WorkerPool::ensure_workers(unsigned count) {
  while (workers_.size() < count) {
    // A new worker waits for the generation after the current one (we hold run_mu_: none runs).
    const unsigned index = static_cast<unsigned>(workers_.size()) + 1;
    const uint32_t start = gen_.load(std::memory_order_relaxed);
    try {
      workers_.emplace_back([this, index, start] { worker_main(index, start); });
      workers_.back().detach();
    } catch (const std::system_error&) {
      return false;
    }
  }
  return true;
}

void WorkerPool::worker_main(unsigned index, uint32_t seen) {
  for (;;) {
    const auto idle_since = std::chrono::steady_clock::now();
    for (unsigned i = 1; gen_.load(std::memory_order_acquire) == seen; ++i) {
      cpu_pause();
      if (i % 64 == 0 && std::chrono::steady_clock::now() - idle_since >
                             std::chrono::microseconds(kIdleSpinMicros)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (gen_.load(std::memory_order_seq_cst) == seen) futex_wait(&gen_, seen);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
    seen = gen_.load(std::memory_order_acquire);
    if (index < team_) job_(ctx_, index, team_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

unsigned WorkerPool::run(unsigned team, Job job, void* ctx) {
  if (team <= 1) {
    job(ctx, 0, 1);
    return 1;
  }
  std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
  if (!lock.owns_lock() || !ensure_workers(team - 1)) {
    job(ctx, 0, 1);
    return 1;
  }
  job_ = job;
  ctx_ = ctx;
  team_ = team;
  pending_.store(static_cast<unsigned>(workers_.size()), std::memory_order_relaxed);
  gen_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&gen_);
  job(ctx, 0, team);
  const auto start = std::chrono::steady_clock::now();
  for (unsigned i = 1; pending_.load(std::memory_order_acquire) != 0; ++i) {
    cpu_pause();
    // An oversubscribed machine: let the workers we wait for have this core.
    if (i % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(200))
      std::this_thread::yield();
  }
  return team;
}

}  // namespace kvr::cpu
