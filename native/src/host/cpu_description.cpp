// The one-line CPU description of kvr_backend_probe and the CPU backend (see cpu_features.h): the
// processor's name, its cores and the kernels the calling thread's kernel cap selects (auto for the
// probe; a CPU model's description opens its model's cap first). Apart from the detection so
// that code needing only the predicates does not pull in every kernel's name.
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "host/cpu_features.h"
#include "host/gemm.h"

namespace kvr::cpu {
namespace {

// "model name" of the first processor in /proc/cpuinfo, or "unknown CPU".
std::string model_name() {
  std::string name = "unknown CPU";
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return name;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "model name", 10) != 0) continue;
    const char* colon = std::strchr(line, ':');
    if (colon == nullptr) continue;
    std::string v(colon + 1);
    const size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t\r\n");
    if (b != std::string::npos && e != std::string::npos) name = v.substr(b, e - b + 1);
    break;
  }
  std::fclose(f);
  return name;
}

}  // namespace

std::string cpu_description() {
  const std::string simd = use_avx2_fma_f16c() ? "avx2-fma-f16c" : "generic";
  return "cpu: " + model_name() + ", " + std::to_string(omp_get_num_procs()) + " cores, " + simd +
         " kernels (gemm " + kernel_name() + (use_amx_bf16() ? ", few-row bf16 amx" : "") + ", int8 " +
         int8_kernel_name() + ", q8 " + q8_kernel_name() + ", q4 " + q4_kernel_name() + ")";
}

}  // namespace kvr::cpu
