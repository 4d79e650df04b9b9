// WorkerPool (see worker_pool.h). Protocol: the caller publishes (job, ctx, team), sets pending_ to
// the number of workers and bumps gen_; every worker, in the team or not, acknowledges every
// generation by decrementing pending_ (so no worker can read the fields of a region that has not
// been published yet); the caller runs its share and returns once pending_ is 0.
#include "host/worker_pool.h"

#include <chrono>
#include <system_error>

#include "host/futex.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace kvr::cpu {

// Moves the calling thread off `caller_cpu` when it runs there (see worker_pool.h). Why: on the 2-vCPU VM a woken
// worker was now and then placed on its waker's CPU while the other CPU idled, and since the two
// threads spin (stage waits, the idle spin) neither slept long enough for the load balancer to
// move one for 5–10 ms: they took turns in ~0.3 ms time slices and decode steps took ~600 µs
// instead of ~50 (perf sched timehist, docs/native.md "Decode with 2 threads"). A one-off
// affinity change migrates the thread at once; the full mask is restored right after (the
// thread stays where it landed). sched_getcpu is a vDSO read: the check costs nanoseconds.
void leave_cpu(int caller_cpu) {
#if defined(__linux__)
  if (caller_cpu < 0 || sched_getcpu() != caller_cpu) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  if (!CPU_ISSET(caller_cpu, &allowed) || CPU_COUNT(&allowed) < 2) return;
  cpu_set_t others = allowed;
  CPU_CLR(caller_cpu, &others);
  if (sched_setaffinity(0, sizeof others, &others) != 0) return;
  sched_setaffinity(0, sizeof allowed, &allowed);
#else
  (void)caller_cpu;
#endif
}

namespace {

int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

}  // namespace

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
    if (index < team_) {
      leave_cpu(caller_cpu_);
      const KernelScope scope(choice_);
      job_(ctx_, index, team_);
    }
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
  caller_cpu_ = current_cpu();
  choice_ = current_choice_ptr();
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
