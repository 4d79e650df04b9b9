// Parallel loops of the multi-row paths (prefill forward, prefill attention, the m > 1 GEMMs) on
// one of two thread sources the caller names: OpenMP (a team per calling thread; lib/native runs
// libgomp with OMP_WAIT_POLICY=passive, so every region and barrier is a futex wake-up) or the
// process-wide WorkerPool (worker_pool.h: the same workers whoever calls, spinning 300 µs between
// regions). The prefill forward uses the pool (~70 regions per chunk: measured in
// docs/int8_gemm.md); other callers keep OpenMP until they measure the change. Not a task system:
// bodies must not throw; a busy pool (another caller) runs the loop on the caller alone. Either
// way every thread runs under the caller's KernelCap (cpu_features.h).
#pragma once

#include <omp.h>

#include <atomic>
#include <cstddef>

#include "host/cpu_features.h"
#include "host/worker_pool.h"

namespace kvr::cpu {

// Where a parallel loop's threads come from.
enum class Workers { kOpenMP, kPool };

namespace detail {
// True on a thread running a pool loop body: a nested loop runs inline (the pool runs one region
// at a time, and its caller must not re-enter it).
inline thread_local bool in_pool_body = false;

template <typename F>
inline void run_pool_body(F& body, size_t i, unsigned t) {
  const bool outer = in_pool_body;
  in_pool_body = true;
  body(i, t);
  in_pool_body = outer;
}
}  // namespace detail

// body(i, t) for every i in [0, count), thread t of the team taking a contiguous range (pool:
// [count·t/T, count·(t+1)/T); OpenMP: schedule(static)). team ≤ 1 or count ≤ 1 runs on the caller.
template <typename F>
void parallel_static(Workers w, int team, size_t count, F&& body) {
  if (team <= 1 || count <= 1 || detail::in_pool_body) {
    for (size_t i = 0; i < count; ++i) body(i, 0u);
    return;
  }
  if (w == Workers::kOpenMP) {
    const KernelChoice* choice = current_choice_ptr();  // the caller's cap, on every thread
#pragma omp parallel num_threads(team)
    {
      const KernelScope scope(choice);
#pragma omp for schedule(static)
      for (long i = 0; i < static_cast<long>(count); ++i) body(static_cast<size_t>(i), static_cast<unsigned>(omp_get_thread_num()));
    }
    return;
  }
  struct Ctx {
    F* f;
    size_t count;
  } ctx{&body, count};
  WorkerPool::shared().run(
      static_cast<unsigned>(team),
      [](void* c, unsigned t, unsigned T) {
        const Ctx& x = *static_cast<const Ctx*>(c);
        const size_t b = x.count * t / T, e = x.count * (t + 1) / T;
        for (size_t i = b; i < e; ++i) detail::run_pool_body(*x.f, i, t);
      },
      &ctx);
}

// body(i, t) for every i in [0, count), each thread claiming the next index when done with its
// last (uneven items; a thread the OS delays holds up one item, not a share).
template <typename F>
void parallel_dynamic(Workers w, int team, size_t count, F&& body) {
  if (team <= 1 || count <= 1 || detail::in_pool_body) {
    for (size_t i = 0; i < count; ++i) body(i, 0u);
    return;
  }
  if (w == Workers::kOpenMP) {
    const KernelChoice* choice = current_choice_ptr();  // the caller's cap, on every thread
#pragma omp parallel num_threads(team)
    {
      const KernelScope scope(choice);
#pragma omp for schedule(dynamic, 1)
      for (long i = 0; i < static_cast<long>(count); ++i) body(static_cast<size_t>(i), static_cast<unsigned>(omp_get_thread_num()));
    }
    return;
  }
  struct Ctx {
    F* f;
    size_t count;
    std::atomic<size_t> next{0};
  } ctx{&body, count};
  WorkerPool::shared().run(
      static_cast<unsigned>(team),
      [](void* c, unsigned t, unsigned) {
        Ctx& x = *static_cast<Ctx*>(c);
        for (size_t i; (i = x.next.fetch_add(1, std::memory_order_relaxed)) < x.count;) detail::run_pool_body(*x.f, i, t);
      },
      &ctx);
}

}  // namespace kvr::cpu
