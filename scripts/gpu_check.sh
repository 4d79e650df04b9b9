#!/usr/bin/env bash
# The GPU check: ONE prepared command for a lent GPU machine (NVIDIA H200, CUDA 13, python3 with
# torch and numpy, no Deno, no network). Builds libkvrelay there with the ptxas resource report
# (or uses KVRELAY_LIB / a carried build), finds cuBLASLt (torch's nvidia-cublas wheel or the
# toolkit), then runs scripts/gpu_check/gpu_check.py: correctness vs the CPU backend and a float64
# reference, the handoff (device snapshot codec vs the golden files, projection, timing),
# compute-sanitizer, bench. Prints one table and `RESULT: N passed, M failed`; JSON and
# logs go to $OUT (default /tmp/gpu_check_out). Ends within ~8 minutes (section budgets).
# Here (no GPU): `scripts/gpu_check.sh --dry-run` runs the same driver with the CPU standing in.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)

# The toolkit's nvcc may not be on PATH (CMake's check_language(CUDA) looks there first).
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="$d:$PATH"; fi
done

lib=${KVRELAY_LIB:-}
if [ -z "$lib" ]; then
  build=build/gpu_check
  jobs=$(nproc 2>/dev/null || echo 4)
  # -DKVR_PTXAS_VERBOSE=ON: registers / shared memory / stack per kernel in the build log.
  if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVR_PTXAS_VERBOSE=ON >"$OUT/build.log" 2>&1 &&
    cmake --build "$build" --parallel "$jobs" >>"$OUT/build.log" 2>&1; then
    lib=$build/libkvrelay.so
    echo "built $lib in $(($(date +%s) - start)) s ($(grep -c 'Used [0-9]* registers' "$OUT/build.log") kernel reports)"
  else
    echo "BUILD FAILED (tail of $OUT/build.log):"
    tail -30 "$OUT/build.log"
    echo "RESULT: 0 passed, 1 failed"
    printf '{"failed": 1, "passed": 0, "error": "build failed"}\n' >"$OUT/gpu_check.json"
    exit 1
  fi
fi

# cuBLASLt for the prefill GEMMs: the loader finds it through LD_LIBRARY_PATH (the library's
# dlopen of libcublasLt.so.13/.12); without it the mma.sync fallback GEMM runs.
lt=$(python3 -c 'import glob,site,sys
paths=[p for d in site.getsitepackages()+[site.getusersitepackages()] for p in glob.glob(d+"/nvidia/cu*/lib/libcublasLt.so*")+glob.glob(d+"/nvidia/cublas/lib/libcublasLt.so*")]
print(sorted(paths)[-1] if paths else "")' 2>/dev/null)
if [ -z "$lt" ]; then lt=$(find / -xdev -name 'libcublasLt.so.1[23]*' 2>/dev/null | head -1); fi
if [ -n "$lt" ]; then
  export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "cuBLASLt: $lt"
else
  echo "cuBLASLt: not found (the fallback GEMM runs)"
fi

left=$((470 - ($(date +%s) - start)))
timeout "$((left + 20))" python3 scripts/gpu_check/gpu_check.py --lib "$lib" --out "$OUT" --budget "$left" "$@" 2>&1 |
  tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
