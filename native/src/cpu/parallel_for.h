// Parallel loops of the multi-row paths (prefill forward, prefill attention, the m > 1 GEMMs) on
// the process-wide WorkerPool (worker_pool.h) instead of OpenMP: lib/native runs libgomp with
// OMP_WAIT_POLICY=passive (spinning teams of many Deno caller threads fought over 2 cores), so
// every OpenMP region and barrier was a futex wake-up, ~70 of them per prefill chunk; the pool's
// workers spin 300 µs between regions. Measured: docs/int8_gemm.md. Not a task system: bodies
// must not throw; a busy pool (another caller) runs the loop on the caller alone.
#pragma once

#include <atomic>
#include <cstddef>

#include "cpu/worker_pool.h"

namespace kvr::cpu {
namespace detail {
// True on a thread running a parallel_static / parallel_dynamic body: a nested loop runs inline
// (the pool runs one region at a time, and its caller must not re-enter it).
inline thread_local bool in_parallel_body = false;

// Runs body(i, t) with in_parallel_body set (restored after, also for the caller thread).
template <typename F>
inline void run_body(F& body, size_t i, unsigned t) {
  const bool outer = in_parallel_body;
  in_parallel_body = true;
  body(i, t);
  in_parallel_body = outer;
}
}  // namespace detail

// body(i, t) for every i in [0, count): thread t of the team gets the contiguous range
// [count·t/T, count·(t+1)/T). team ≤ 1 (or count ≤ 1) runs on the caller.
template <typename F>
void parallel_static(int team, size_t count, F&& body) {
  if (team <= 1 || count <= 1 || detail::in_parallel_body) {
    for (size_t i = 0; i < count; ++i) body(i, 0u);
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
        for (size_t i = b; i < e; ++i) detail::run_body(*x.f, i, t);
      },
      &ctx);
}

// body(i, t) for every i in [0, count), each thread t claiming the next index when done with its
// last (uneven items; a thread the OS delays holds up one item, not a share).
template <typename F>
void parallel_dynamic(int team, size_t count, F&& body) {
  if (team <= 1 || count <= 1 || detail::in_parallel_body) {
    for (size_t i = 0; i < count; ++i) body(i, 0u);
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
        for (size_t i; (i = x.next.fetch_add(1, std::memory_order_relaxed)) < x.count;) detail::run_body(*x.f, i, t);
      },
      &ctx);
}

}  // namespace kvr::cpu
