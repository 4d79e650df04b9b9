// A process-wide pool of persistent worker threads for short parallel regions (a decode step).
// Why not OpenMP: Deno runs every nonblocking FFI call on whichever thread of its blocking pool is
// free, and libgomp keeps one thread team per *calling* thread, so successive decode steps came
// from 12–32 different callers, each with its own team of sleeping or spinning workers: the
// region start cost ~40–380 µs and the partner thread was often not running (measured, see
// docs/native.md "Decode step"). Here the workers are the same threads whoever calls. Not a
// general task system: one region at a time; a second concurrent caller runs alone (1 thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "host/cpu_features.h"

namespace kvr::cpu {

// Moves the calling thread off CPU `cpu` if it is running there and the thread may run elsewhere
// (its affinity mask is left as it was); otherwise does nothing. A worker calls it with its
// caller's CPU at each region start (worker_pool.cpp: why).
void leave_cpu(int cpu);

class WorkerPool {
 public:
  // The job of one region: called as job(ctx, t, T) for every t in [0, T), concurrently; must
  // not throw.
  using Job = void (*)(void* ctx, unsigned t, unsigned team);

  // The process-wide pool (workers start on first use and live until the process exits).
  static WorkerPool& shared();

  // Runs job on `team` threads: the caller is thread 0, pool workers the others (each under the
  // caller's KernelCap, cpu_features.h: a kernel choice holds on every thread of a call), and returns
  // when all are done. When another caller is using the pool, or a worker cannot be started,
  // runs job(ctx, 0, 1) on the caller alone. Returns the team size used (team or 1).
  unsigned run(unsigned team, Job job, void* ctx);

  // Workers spin this long for the next region before sleeping (a decode loop's next step
  // usually comes within tens of microseconds; a sleeping worker costs a futex wake-up).
  static constexpr uint32_t kIdleSpinMicros = 300;

 private:
  WorkerPool() = default;
  void worker_main(unsigned index, uint32_t seen);
  bool ensure_workers(unsigned count);  // under run_mu_

  std::mutex run_mu_;                    // one region at a time (try_lock: else run alone)
  std::vector<std::thread> workers_;     // under run_mu_
  Job job_ = nullptr;                    // written before gen_ is bumped
  void* ctx_ = nullptr;
  unsigned team_ = 1;
  int caller_cpu_ = -1;                  // the caller's CPU at region start (written before gen_)
  const KernelChoice* choice_ = nullptr; // the caller's kernel cap, installed by each worker
  alignas(64) std::atomic<uint32_t> gen_{0};  // region generation (the futex word)
  alignas(64) std::atomic<unsigned> pending_{0};  // workers of the current region not done yet
  std::atomic<unsigned> sleepers_{0};
};

}  // namespace kvr::cpu
