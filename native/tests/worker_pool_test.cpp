// g++ unit test of leave_cpu (host/worker_pool.h): a thread placed on CPU c (affinity {c}, then
// its full mask back) calls leave_cpu(c) and must then run on another CPU with its mask unchanged;
// called with a CPU it is not on, it must not move. Skipped (0 checks reported as such) on a
// machine or cpuset with one CPU. Prints "worker_pool: N checks, M failed"; exit status 1 on any
// failure. Built by CMake; run by worker_pool_test.ts.
#include "host/worker_pool.h"

#include <sched.h>

#include <cstdio>
#include <thread>

namespace {

size_t checks = 0, failed = 0;

void check(bool ok, const char* what, long a, long b) {
  ++checks;
  if (!ok) {
    ++failed;
    std::printf("FAIL %s: %ld vs %ld\n", what, a, b);
  }
}

// Runs on a fresh thread: for every allowed CPU c, sit on c, leave it, check.
void trial(const cpu_set_t& allowed) {
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    cpu_set_t only;
    CPU_ZERO(&only);
    CPU_SET(c, &only);
    if (sched_setaffinity(0, sizeof only, &only) != 0) continue;
    check(sched_getcpu() == c, "placed on the CPU", sched_getcpu(), c);
    // Another CPU: no move (checked while pinned to c, so the scheduler cannot move it either).
    int other = -1;
    for (int o = 0; o < CPU_SETSIZE && other < 0; ++o)
      if (o != c && CPU_ISSET(o, &allowed)) other = o;
    kvr::cpu::leave_cpu(other);
    check(sched_getcpu() == c, "no move when on another CPU", sched_getcpu(), c);
    // The caller's CPU: a move. leave_cpu restores the whole mask at once, so on a loaded machine
    // the scheduler may put the thread back on c before it is observed; a working leave_cpu moves
    // it in most attempts, one that does nothing in almost none.
    int attempts = 0, moved = 0;
    for (int a = 0; a < 8; ++a) {
      sched_setaffinity(0, sizeof only, &only);
      sched_setaffinity(0, sizeof allowed, &allowed);
      if (sched_getcpu() != c) continue;  // moved already: not an attempt
      ++attempts;
      kvr::cpu::leave_cpu(c);
      if (sched_getcpu() != c) ++moved;
    }
    check(attempts == 0 || 2 * moved >= attempts, "moved off the caller's CPU", moved, attempts);
    cpu_set_t now;
    sched_getaffinity(0, sizeof now, &now);
    check(CPU_EQUAL(&now, &allowed), "affinity mask restored", CPU_COUNT(&now), CPU_COUNT(&allowed));
  }
}

}  // namespace

int main() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) {
    std::printf("worker_pool: skipped (fewer than 2 CPUs)\n");
    return 0;
  }
  for (int round = 0; round < 20; ++round) {
    std::thread t(trial, std::cref(allowed));
    t.join();
  }
  std::printf("worker_pool: %zu checks, %zu failed\n", checks, failed);
  return failed == 0 ? 0 : 1;
}
