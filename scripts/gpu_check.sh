#!/usr/bin/env bash
# The GPU check: ONE prepared command for a lent GPU machine (NVIDIA H200, CUDA 13, python3 with
# torch and numpy, no Deno, no network). Builds libkvrelay there with the ptxas resource report
# (or uses KVRELAY_LIB): with -Werror first, and if that fails once more without it, reporting the
# warnings as a failed check instead of losing the run to a newer compiler. Finds cuBLASLt by
# soname, then runs scripts/gpu_check/gpu_check.py (sections: probe, correctness, coverage, handoff,
# batch, sanitizer, bench; see its docstring). Prints one table and `RESULT: N passed, M failed`;
# gpu_check.json (rewritten after every section and on SIGTERM) and logs go to $OUT (default
# /tmp/gpu_check_out). Everything, the build included, ends within GPU_CHECK_BUDGET seconds
# (default 300, so a fixed rerun fits the same lease); --no-bench skips the timings.
# Here (no GPU): `scripts/gpu_check.sh --dry-run` runs the same driver with the CPU standing in.
# Environment: OUT, KVRELAY_LIB (skip the build), GPU_CHECK_BUDGET, BUILD_DIR (default
# build/gpu_check), CUBLASLT_SEARCH (colon-separated folders to search instead of the defaults).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
budget=${GPU_CHECK_BUDGET:-300}

# The toolkit's nvcc may not be on PATH (CMake's check_language(CUDA) looks there first).
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  if [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="$d:$PATH"; fi
done

# build.json for the driver: {"werror": "ok" | "failed" | "skipped", "warnings": [...], "why": ...}
build_report() { # $1 werror state, $2 log with the warnings (or ""), $3 why
  python3 - "$1" "$2" "$3" >"$OUT/build.json" <<'PY'
import json, re, sys
state, log, why = sys.argv[1:4]
lines = []
if log:
    with open(log, errors="replace") as f:
        lines = [ln.strip() for ln in f if re.search(r"warning|error", ln, re.I)]
print(json.dumps({"werror": state, "warnings": lines[:200], "why": why}))
PY
}

lib=${KVRELAY_LIB:-}
if [ -z "$lib" ]; then
  build=${BUILD_DIR:-build/gpu_check}
  jobs=$(nproc 2>/dev/null || echo 4)
  build_with() { # $1: KVR_WERROR ON|OFF, $2: log
    # -DKVR_PTXAS_VERBOSE=ON: registers / shared memory / stack per kernel in the build log.
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVR_PTXAS_VERBOSE=ON -DKVR_WERROR="$1" >"$2" 2>&1 &&
      cmake --build "$build" --parallel "$jobs" >>"$2" 2>&1
  }
  if build_with ON "$OUT/build.log"; then
    build_report ok "" ""
  else
    echo "the -Werror build failed (tail of $OUT/build.log):"
    tail -15 "$OUT/build.log"
    echo "retrying once without -Werror (the warnings become a failed check)"
    if build_with OFF "$OUT/build_nowerror.log"; then
      build_report failed "$OUT/build_nowerror.log" ""
    else
      echo "BUILD FAILED without -Werror too (tail of $OUT/build_nowerror.log):"
      tail -30 "$OUT/build_nowerror.log"
      echo "RESULT: 0 passed, 1 failed"
      printf '{"failed": 1, "passed": 0, "error": "build failed"}\n' >"$OUT/gpu_check.json"
      exit 1
    fi
  fi
  lib=$build/libkvrelay.so
  echo "built $lib in $(($(date +%s) - start)) s ($(cat "$OUT"/build*.log | grep -c 'Used [0-9]* registers') kernel reports)"
else
  build_report skipped "" "KVRELAY_LIB=$lib: not built here"
fi

# cuBLASLt for the prefill GEMMs: the library dlopens libcublasLt.so.13 (then .so.12) through the
# loader's search path, so the folder holding that soname goes on LD_LIBRARY_PATH. Chosen by
# soname, .so.13 before .so.12, never by how the paths sort.
find_cublaslt() {
  local roots=${CUBLASLT_SEARCH:-}
  if [ -z "$roots" ]; then
    roots=$(python3 -c 'import site; print(":".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      2>/dev/null):/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
  fi
  local so d hit dirs
  IFS=: read -ra dirs <<<"$roots"
  for so in libcublasLt.so.13 libcublasLt.so.12; do
    for d in "${dirs[@]}"; do
      [ -d "$d" ] || continue
      hit=$(find "$d" -name "$so" 2>/dev/null | sort | head -1)
      if [ -n "$hit" ]; then
        echo "$hit"
        return
      fi
    done
    if [ -z "${CUBLASLT_SEARCH:-}" ]; then # last resort: the whole file system, by soname
      hit=$(find / -xdev -name "$so" 2>/dev/null | sort | head -1)
      if [ -n "$hit" ]; then
        echo "$hit"
        return
      fi
    fi
  done
}
lt=$(find_cublaslt)
if [ -n "$lt" ]; then
  export LD_LIBRARY_PATH="$(dirname "$lt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "cuBLASLt: $lt"
else
  echo "cuBLASLt: not found (the fallback GEMM runs; the probe section fails on it)"
fi

left=$((budget - ($(date +%s) - start)))
if [ "$left" -lt 60 ]; then left=60; fi
# The driver keeps its own deadlines; this is the backstop. SIGTERM first (the driver writes its
# table and gpu_check.json on it), SIGKILL 10 s later.
timeout -k 10 "$((left + 30))" python3 scripts/gpu_check/gpu_check.py --lib "$lib" --out "$OUT" --budget "$left" \
  --build-report "$OUT/build.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
