#!/usr/bin/env python3
"""The GPU check driver (run by scripts/gpu_check.sh on a GPU machine; dry-run on the CPU here).

Drives libkvrelay through its C ABI (ctypes, kvr.py) and reports one table plus
`RESULT: N passed, M failed`, with gpu_check.json and logs under --out. Sections, in this order,
each in its own process (a CUDA fault is sticky for its process: it fails that section, not the
rest), each killed at its deadline:
  probe        the CPU and CUDA probes; cuBLASLt loaded. Without a usable CUDA device (and no
               --dry-run) the check stops here: the sections would compare the CPU with itself.
  correctness  backend under test (CUDA; the CPU in a dry run) vs the CPU backend and vs a float64
               numpy reference (reference.py) at every position of a prefill, chunked prefills and
               24 decodes, on the demo models and generated checkpoints (every family and weight
               dtype), f32, bf16 and f16 KV; KV read/write round trip; 64-step greedy agreement. One
               process per model.
  coverage     paths the small models miss, vs the CPU backend (coverage.py): a 151,936-token
               vocabulary (logits, device greedy/top-k sampling), a 600-token prefill and decodes at
               4k context (f32 and f16 KV), the mma.sync GEMM forced where cuBLASLt loaded, the
               GEMV's scalar path.
  handoff      golden-snapshot codec export/import byte-identical to the CPU's, projection of the demo
               pair vs the CPU (KL within 0.005), device sampling, fit statistics; timings (handoff.py).
  batch        batched steps (kvr_batch_step, paged + contiguous sequences) vs each sequence alone,
               native sampling in the step, pool exhaustion (batch.py); in a dry run also a short
               batch-size sweep on the CPU.
  sanitizer    compute-sanitizer memcheck (cuBLASLt prefill) and racecheck (the library's own GEMM),
               side by side, on a short run (this script, --child); each tool's own summary line is
               its verdict.
  bench        last, skipped by --no-bench: prefill/decode tokens/s for the demo models and
               random-weight Qwen3-0.6B / Qwen3-8B shapes beside torch eager, ceilings, batched
               decode tokens/s, device sampling and migration timings. Timing only: it compares
               nothing.
gpu_check.json is rewritten after every section (`running` names the one in progress) and on
SIGTERM (`terminated`), so a run cut short keeps what it found."""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvr  # noqa: E402
from reference import Reference, make_config, test_checkpoints, write_checkpoint  # noqa: E402
from handoff import section_handoff  # noqa: E402
from batch import bench_batch_sweep, section_batch  # noqa: E402
from coverage import section_coverage  # noqa: E402

F32_BOUND, BF16_BOUND = 1e-3, 5e-3  # the repository's oracle bounds (tests/native_vs_reference_test.ts)
DEMOS = ["tiny-fast", "tiny-balanced", "tiny-powerful"]
SECTIONS = ["correctness", "coverage", "handoff", "batch", "sanitizer", "bench"]
# Shares of --budget; the bench (last) gets what is left.
# The sanitizer's share is the largest: both tools run side by side, each with all of it, and an
# instrumented run (memcheck through cuBLASLt's modules) is many times slower than a plain one.
SHARE = {"correctness": 0.22, "coverage": 0.10, "handoff": 0.10, "batch": 0.10, "sanitizer": 0.30}


class Rows(list):
    """rep.bench: a list whose appends also go to the report's sink."""

    def __init__(self, emit):
        super().__init__()
        self._emit = emit

    def append(self, row):
        super().append(row)
        self._emit("bench", {"row": row})


class Report:
    """Checks, skips, bench rows and info. In a section's process every check and skip is also
    written to `sink` (JSON lines) as it happens, so the parent keeps them if the process dies."""

    def __init__(self, sink=None):
        self.sink = sink
        self.checks, self.skipped, self.info = [], [], {}
        self.bench = Rows(self._emit)

    def _emit(self, kind, rec):
        if self.sink:
            self.sink.write(json.dumps({"kind": kind, **rec}) + "\n")
            self.sink.flush()

    def check(self, section, name, ok, detail=""):
        c = {"section": section, "name": name, "ok": bool(ok), "detail": detail}
        self.checks.append(c)
        self._emit("check", {"check": c})
        print(f"  [{'PASS' if ok else 'FAIL'}] {section}: {name} {detail}", flush=True)

    def skip(self, section, name, why):
        s = {"section": section, "name": name, "why": why}
        self.skipped.append(s)
        self._emit("skip", {"skip": s})
        print(f"  [skip] {section}: {name}: {why}", flush=True)

    def finish(self):
        """The section's process ended normally: its info (timings) goes to the parent too."""
        self._emit("final", {"info": self.info})

    def merge(self, path):
        """Adds a section process's records; True when it finished normally."""
        final = False
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            if r["kind"] == "check":
                self.checks.append(r["check"])
            elif r["kind"] == "skip":
                self.skipped.append(r["skip"])
            elif r["kind"] == "bench":
                list.append(self.bench, r["row"])
            elif r["kind"] == "final":
                final = True
                for k, v in r["info"].items():
                    if isinstance(v, list):
                        self.info.setdefault(k, []).extend(v)
                    else:
                        self.info[k] = v
        return final

    @property
    def failed(self):
        return sum(not c["ok"] for c in self.checks)

    @property
    def passed(self):
        return sum(c["ok"] for c in self.checks)


def ratio(a, ref):
    """max |a - ref| / max |ref| (NaN → inf): the oracle metric."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = np.abs(a - ref)
    if not np.all(np.isfinite(d)):
        return float("inf")
    return float(d.max() / max(np.abs(ref).max(), 1e-30))


def try_import_torch():
    try:
        import torch  # noqa: F401
        return torch, ""
    except Exception as e:  # noqa: BLE001
        return None, f"torch not importable ({type(e).__name__}: {e})"


# ---------------------------------------------------------------- correctness

def check_model(rep, lib, dut_backend, model_dir, kv, tokens, decode_tokens, greedy_steps, ref_logits):
    name = f"{os.path.basename(model_dir)}/{kv}"
    bound = F32_BOUND if kv == "f32" else BF16_BOUND
    T, D = len(tokens), len(decode_tokens)
    cpu = kvr.Model(lib, model_dir, kv, "cpu", n_threads=0)
    dut = kvr.Model(lib, model_dir, kv, dut_backend)
    try:
        cap = T + D + max(greedy_steps, 1) + 4
        # one prefill, every position
        s_cpu, s_dut = cpu.seq(cap), dut.seq(cap)
        lc, ld = s_cpu.prefill(tokens, True), s_dut.prefill(tokens, True)
        r_cpu, r_ref = ratio(ld, lc), ratio(ld, ref_logits[:T])
        rep.check("correctness", f"{name} prefill {T} vs cpu", r_cpu < bound, f"ratio {r_cpu:.2e}")
        rep.check("correctness", f"{name} prefill {T} vs f64 reference", r_ref < bound, f"ratio {r_ref:.2e}")
        # decodes (teacher-forced with fixed tokens) on both
        dl, cl = [], []
        for t in decode_tokens:
            dl.append(s_dut.decode(t))
            cl.append(s_cpu.decode(t))
        dl, cl = np.stack(dl), np.stack(cl)
        # decode i consumed decode_tokens[i] at position T+i: reference row T+i
        r_dec = ratio(dl, ref_logits[T:T + D])
        rep.check("correctness", f"{name} {D} decodes vs f64 reference", r_dec < bound, f"ratio {r_dec:.2e}")
        rep.check("correctness", f"{name} {D} decodes vs cpu", ratio(dl, cl) < bound, f"ratio {ratio(dl, cl):.2e}")
        # chunked prefills
        s2 = dut.seq(cap)
        cuts = [0, 7, 20, T]
        parts = [s2.prefill(tokens[a:b], True) for a, b in zip(cuts, cuts[1:])]
        r_ch = ratio(np.concatenate(parts), ref_logits[:T])
        rep.check("correctness", f"{name} chunked prefill 7+13+{T - 20} vs f64 reference", r_ch < bound,
                  f"ratio {r_ch:.2e}")
        s2.close()
        # KV round trip: read every layer in the cache dtype, write into a fresh sequence, decode
        n = s_dut.length()
        s3 = dut.seq(cap)
        L = cpu.params.num_layers
        kv_ratio = 0.0
        for layer in range(L):
            k, v = s_dut.kv_read(layer, 0, n, kv)
            s3.kv_write(layer, 0, k, v, kv)
            kf, vf = s_dut.kv_read(layer, 0, n, "f32")
            kc, vc = s_cpu.kv_read(layer, 0, n, "f32")
            kv_ratio = max(kv_ratio, ratio(kf, kc), ratio(vf, vc))
        s3.set_length(n)
        nxt = int(tokens[0])
        a, b = s_dut.decode(nxt), s3.decode(nxt)
        same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
        rep.check("correctness", f"{name} KV read→write round trip decodes bit-identically", same,
                  "" if same else round_trip_diagnosis(dut, s_dut, n, kv, L, cap, nxt, a, b))
        rep.check("correctness", f"{name} KV cache (f32 view) vs cpu", kv_ratio < bound, f"ratio {kv_ratio:.2e}")
        for s in (s_cpu, s_dut, s3):
            s.close()
        # greedy agreement
        if greedy_steps:
            outs = []
            for m in (cpu, dut):
                s = m.seq(cap)
                logits = s.prefill(tokens)[0]
                seq = []
                for _ in range(greedy_steps):
                    t = int(np.argmax(logits))
                    seq.append(t)
                    logits = s.decode(t)
                outs.append(seq)
                s.close()
            same = next((i for i, (x, y) in enumerate(zip(*outs)) if x != y), None)
            rep.check("correctness", f"{name} greedy {greedy_steps} steps same tokens as cpu", same is None,
                      "" if same is None else f"first difference at step {same}")
    finally:
        cpu.close()
        dut.close()


def round_trip_diagnosis(dut, src, n, kv, layers, cap, token, a, b):
    """Why a round trip differed: how much, and two more copies of src's first n positions decoded
    the same way — equal to each other and to the copy b means the original's step differed; unequal
    means the decode step itself is not reproducible. (The check once failed under load and could
    not be reproduced: this says which it was next time.)"""
    diff = a != b
    msg = f"{int(diff.sum())} of {a.size} logits differ, max |diff| {float(np.abs(a - b).max()):.3e}"
    try:
        outs = []
        for _ in range(2):
            c = dut.seq(cap)
            for layer in range(layers):
                k, v = src.kv_read(layer, 0, n, kv)
                c.kv_write(layer, 0, k, v, kv)
            c.set_length(n)
            outs.append(c.decode(token))
            c.close()
        bits = [o.view(np.uint32) for o in outs]
        msg += (f"; replays equal each other: {np.array_equal(bits[0], bits[1])}, "
                f"equal the copy: {np.array_equal(bits[0], b.view(np.uint32))}, "
                f"equal the original: {np.array_equal(bits[0], a.view(np.uint32))}")
    except Exception as e:  # noqa: BLE001
        msg += f"; replay raised {type(e).__name__}: {e}"
    return msg


def correctness_model(rep, lib, dut_backend, model_dir, kvs, demo, seed):
    """One model of the correctness section (its own process): every KV dtype in kvs."""
    rng = np.random.default_rng(seed)
    for kv in kvs:
        cfg = kvr.load_config(model_dir)
        V = cfg["vocab_size"]
        T, D = (40, 24)
        tokens = rng.integers(0, V, T).astype(np.int32)
        dec = rng.integers(0, V, D).astype(np.int32)
        ref = Reference(model_dir, kv).forward(np.concatenate([tokens, dec]))
        try:
            check_model(rep, lib, dut_backend, model_dir, kv, tokens, dec, 64 if demo else 0, ref)
        except Exception as e:  # noqa: BLE001
            rep.check("correctness", f"{os.path.basename(model_dir)}/{kv}", False,
                      f"raised {type(e).__name__}: {e}")
            traceback.print_exc()


def correctness_cases(quick, workdir):
    """(model dir, KV dtypes, demo?) per correctness process: the demo models in f32 and bf16 KV (and
    tiny-fast in f16 too), the generated checkpoints in f32 (and bf16 unless quick)."""
    out = [(os.path.join(ROOT, "models", d), ["f32", "bf16", "f16"] if d == "tiny-fast" else ["f32", "bf16"], True)
           for d in DEMOS]
    out += [(d, ["f32"] if quick else ["f32", "bf16"], False)
            for d in test_checkpoints(os.path.join(workdir, "checkpoints"))]
    return out


def check_probes(rep, lib, cuda_ok, cuda_info, dry_run):
    """Probe answers: the CPU always available; with a device, cuBLASLt loaded (the production
    prefill path; without it that path is untested, a failure, not a note); in a dry run without a
    device, cuda refused cleanly."""
    st, info = kvr.probe(lib, "cpu")
    rep.check("probe", "cpu probe OK", st == kvr.OK, info)
    m = kvr.Model(lib, os.path.join(ROOT, "models", "tiny-fast"), "f32", "cpu")
    try:  # the debug switches the sections use (--sync-launches, the forced fallback GEMM)
        sts = [lib.kvr_model_set_debug(m.handle, f) for f in (kvr.DEBUG_FALLBACK_GEMM | kvr.DEBUG_SYNC_LAUNCHES, 4, 0)]
        rep.check("probe", "kvr_model_set_debug takes its flags and refuses unknown bits", sts == [kvr.OK, -1, kvr.OK],
                  f"statuses {sts}")
    finally:
        m.close()
    if cuda_ok:
        rep.check("probe", "cuda probe OK", True, cuda_info)
        rep.check("probe", "cuBLASLt loaded (the prefill GEMM path under test)", "cuBLASLt found" in cuda_info,
                  cuda_info[cuda_info.find("cuBLASLt"):])
        return
    if not dry_run:
        rep.check("probe", "a CUDA device is usable", False, cuda_info)
        return
    rep.check("probe", "cuda probe refuses cleanly without a device",
              cuda_info.startswith("no CUDA device") or cuda_info.startswith("built without CUDA"), cuda_info)
    try:
        kvr.Model(lib, os.path.join(ROOT, "models", "tiny-fast"), "f32", "cuda").close()
        rep.check("probe", "loading a model with backend cuda is refused", False, "it loaded")
    except kvr.EngineError as e:
        rep.check("probe", "loading a model with backend cuda is refused", e.status == -5, str(e))


def check_build(rep, path):
    """The build report gpu_check.sh writes: did the -Werror build pass, and which warnings did the
    retry without it print."""
    if not path:
        return
    try:
        with open(path) as f:
            b = json.load(f)
    except (OSError, ValueError) as e:
        rep.check("build", "build report readable", False, f"{path}: {e}")
        return
    if b.get("werror") == "skipped":
        rep.skip("build", "library builds with -Werror", b.get("why", "not built here"))
        return
    warnings = b.get("warnings", [])
    rep.check("build", "library builds with -Werror", b.get("werror") == "ok",
              "" if b.get("werror") == "ok" else
              f"failed; rebuilt without -Werror, {len(warnings)} warning lines: " + " | ".join(warnings[:8]))


def check_cublaslt_abi(rep):
    """static_asserts of our hand-written cuBLASLt declarations against the real header."""
    hdrs = sorted(set(glob.glob("/usr/local/cuda*/include/cublasLt.h") +
                      glob.glob("/usr/local/cuda*/targets/*/include/cublasLt.h") +
                      glob.glob(os.path.join(sys.prefix, "lib", "python3*", "*-packages", "nvidia", "*",
                                             "include", "cublasLt.h")) +
                      glob.glob("/usr/lib/python3*/*-packages/nvidia/*/include/cublasLt.h") +
                      glob.glob("/usr/local/lib/python3*/*-packages/nvidia/*/include/cublasLt.h")))
    cuda_inc = sorted(glob.glob("/usr/local/cuda*/include/cuda_runtime.h") +
                      glob.glob("/usr/local/cuda*/targets/*/include/cuda_runtime.h"))
    if not hdrs or not cuda_inc or not shutil.which("g++"):
        rep.skip("build", "cuBLASLt declarations vs cublasLt.h", "no cublasLt.h / cuda_runtime.h / g++ here")
        return
    inc = [f"-I{os.path.dirname(hdrs[0])}", f"-I{os.path.dirname(cuda_inc[0])}"]
    cmd = ["g++", "-std=c++17", "-fsyntax-only", *inc, f"-I{ROOT}/native/src",
           os.path.join(HERE, "cublaslt_abi_check.cpp")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    rep.check("build", f"cuBLASLt declarations match {hdrs[0]}", p.returncode == 0, p.stderr[-400:])


# ---------------------------------------------------------------- sanitizer

def sanitizer_verdict(tool, rc, out):
    """(ok, detail) of one compute-sanitizer run from the tool's own summary line: memcheck prints
    `ERROR SUMMARY: N errors`, racecheck `RACECHECK SUMMARY: N hazards displayed (E errors, W
    warnings)`. Clean means that line with 0 errors, exit status 0 and the child's last line."""
    done = "child run done" in out
    if tool == "racecheck":
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", out)
        clean = m is not None and int(m.group(2)) == 0
    else:
        m = re.search(r"ERROR SUMMARY: (\d+) errors?", out)
        clean = m is not None and int(m.group(1)) == 0
    summary = m.group(0) if m else f"no {tool} summary line"
    ok = clean and rc == 0 and done
    return ok, f"exit {rc}, {summary}" + ("" if done else ", the run did not finish")


SANITIZER_ARGS = {
    # API errors raised and handled inside cudart/cuBLASLt are not ours; the child checks every
    # status of its own calls (and fails on one).
    "memcheck": ["--tool", "memcheck", "--report-api-errors", "no", "--leak-check", "no"],
    # The library's own GEMM (shared memory, the race-prone kernel), not cuBLASLt's kernels.
    "racecheck": ["--tool", "racecheck"],
}


def section_sanitizer(rep, args, budget, dut, state):
    exe = args.sanitizer or shutil.which("compute-sanitizer") or next(
        iter(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")), None)
    if not exe:
        rep.skip("sanitizer", "memcheck/racecheck", "compute-sanitizer not found")
        return
    if dut != "cuda" and not args.sanitizer:
        rep.skip("sanitizer", "memcheck/racecheck", "no CUDA device (dry run)")
        return
    procs = {}
    for tool, extra in SANITIZER_ARGS.items():
        cmd = [exe, *extra, "--error-exitcode", "9", sys.executable, os.path.abspath(__file__), "--child",
               "--lib", args.lib] + (["--dry-run"] if args.dry_run else []) + (
               ["--fallback-gemm"] if tool == "racecheck" else [])
        log = open(os.path.join(args.out, f"sanitizer_{tool}.log"), "w+")
        procs[tool] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log)
    state.children = [p for p, _ in procs.values()]
    deadline = time.time() + budget
    try:
        for tool, (p, log) in procs.items():
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                kill_group(p)
                rc = None
            log.seek(0)
            out = log.read()
            log.close()
            if rc is None:
                rep.check("sanitizer", f"{tool} on a short run", False,
                          f"killed after {budget:.0f}s (the section's time); last line: "
                          f"{(out.strip().splitlines() or [''])[-1][:200]}")
                continue
            ok, detail = sanitizer_verdict(tool, rc, out)
            rep.check("sanitizer", f"{tool} on a short run", ok, detail)
    finally:
        for p, _ in procs.values():
            kill_group(p)
        state.children = []


def child_short_run(lib_path, backend, debug):
    """The run under compute-sanitizer: prefill, chunked prefill, decodes (graph), KV round trip,
    batched steps with device sampling."""
    lib = kvr.open_library(lib_path)
    m = kvr.Model(lib, os.path.join(ROOT, "models", "tiny-fast"), "bf16", backend, debug=debug)
    s = m.seq(96)
    toks = np.arange(1, 41, dtype=np.int32)
    s.prefill(toks[:13], True)
    s.prefill(toks[13:], False)
    for t in range(4):
        s.decode(t + 5)
    k, v = s.kv_read(0, 0, s.length(), "bf16")
    s.kv_write(0, 0, k, v, "bf16")
    # a batched step: two paged sequences (prefill chunk + decode) and the contiguous one, then
    # batched decodes with device greedy sampling (batch.py)
    import batch
    from handoff import make_sampler
    batch.bind(lib)
    pool = batch.Pool(m, 16, 16)
    a, b = pool.seq(96), pool.seq(96)
    steps = [batch.step(m, [(a, toks[:20], False), (b, toks[:5], True), (s, [7], True)])[0]]
    smp = [make_sampler(lib, 0.0) for _ in range(3)]
    for t in range(3):
        steps.append(batch.step(m, [(a, [t + 1], False), (b, [t + 2], False), (s, [t + 3], False)],
                                samplers=smp)[0])
    if any(st != kvr.OK for st in steps):
        raise kvr.EngineError(min(steps), lib.kvr_last_error().decode(), "kvr_batch_step")
    for q in smp:
        lib.kvr_sampler_free(q)
    for q in (a, b, s):
        q.close()
    pool.close()
    m.close()
    print("child run done")


# ---------------------------------------------------------------- bench

def bench_ceilings(rep, torch):
    dev = torch.device("cuda")
    n = 1 << 30  # 1 GiB per buffer
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    bw = 2 * n / float(np.median(ts))
    del a, b
    N = 8192
    x = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    y = torch.randn(N, N, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        x @ y
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 1e3)
    flops = 2 * N ** 3 / float(np.median(ts))
    rep.info["copy_bandwidth_GBps"] = bw / 1e9
    rep.info["bf16_matmul_TFLOPs"] = flops / 1e12
    rep.bench.append({"model": "ceiling", "what": "device copy GB/s (read+write)", "kvrelay": bw / 1e9})
    rep.bench.append({"model": "ceiling", "what": "bf16 matmul TFLOP/s (8192^3)", "kvrelay": flops / 1e12})


def torch_model(torch, model_dir):
    """A minimal eager torch model (bf16) over the checkpoint's weights, for the baseline."""
    from reference import rope_inv_freq
    cfg = kvr.load_config(model_dir)
    dev = torch.device("cuda")

    def t(name):
        r = kvr.read_tensor_raw(model_dir, name)
        if r is None:
            return None
        dtype, a = r
        if dtype == "BF16":  # bit patterns straight to the device: no float copy on the host
            return torch.from_numpy(a.view(np.int16).copy()).to(dev).view(torch.bfloat16)
        return torch.from_numpy(a.astype(np.float32)).to(dev, torch.bfloat16)

    heads, kvh = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    W = {"embed": t("model.embed_tokens.weight"), "norm": t("model.norm.weight")}
    W["lm_head"] = t("lm_head.weight")
    if W["lm_head"] is None:
        W["lm_head"] = W["embed"]
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layers.append({k: t(p + k) for k in (
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")})
    inv = torch.tensor(rope_inv_freq(cfg, hd), dtype=torch.float32, device=dev)
    eps = cfg.get("rms_norm_eps", 1e-6)
    F = torch.nn.functional

    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(x, pos):
        ang = pos[:, None].float() * inv[None, :]
        c, s = ang.cos().to(x.dtype)[None, :, None, :], ang.sin().to(x.dtype)[None, :, None, :]
        h = hd // 2
        a, b = x[..., :h], x[..., h:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)

    def forward(tokens, cache, pos0):
        """tokens (T,) long; cache: list of (K, V) (1, kvh, cap, hd); returns last logits."""
        T = tokens.shape[0]
        pos = torch.arange(pos0, pos0 + T, device=dev)
        x = W["embed"][tokens][None]
        for L, (K, V) in zip(layers, cache):
            h = rms(x, L["input_layernorm.weight"])
            q = F.linear(h, L["self_attn.q_proj.weight"], L["self_attn.q_proj.bias"]).view(1, T, heads, hd)
            k = F.linear(h, L["self_attn.k_proj.weight"], L["self_attn.k_proj.bias"]).view(1, T, kvh, hd)
            v = F.linear(h, L["self_attn.v_proj.weight"], L["self_attn.v_proj.bias"]).view(1, T, kvh, hd)
            if L["self_attn.q_norm.weight"] is not None:
                q, k = rms(q, L["self_attn.q_norm.weight"]), rms(k, L["self_attn.k_norm.weight"])
            q, k = rope(q, pos), rope(k, pos)
            K[:, :, pos0:pos0 + T] = k.transpose(1, 2)
            V[:, :, pos0:pos0 + T] = v.transpose(1, 2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), K[:, :, :pos0 + T], V[:, :, :pos0 + T],
                                               is_causal=T > 1 and pos0 == 0, enable_gqa=heads != kvh)
            x = x + F.linear(o.transpose(1, 2).reshape(1, T, heads * hd), L["self_attn.o_proj.weight"])
            h = rms(x, L["post_attention_layernorm.weight"])
            x = x + F.linear(F.silu(F.linear(h, L["mlp.gate_proj.weight"])) * F.linear(h, L["mlp.up_proj.weight"]),
                             L["mlp.down_proj.weight"])
        return F.linear(rms(x[:, -1], W["norm"]), W["lm_head"])

    def new_cache(cap):
        return [(torch.zeros(1, kvh, cap, hd, device=dev, dtype=torch.bfloat16),
                 torch.zeros(1, kvh, cap, hd, device=dev, dtype=torch.bfloat16)) for _ in layers]

    return forward, new_cache


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def bench_model(rep, lib, torch, model_dir, label, deadline):
    V = kvr.load_config(model_dir)["vocab_size"]
    m = kvr.Model(lib, model_dir, "bf16", "cuda")
    row = {"model": label}
    rng = np.random.default_rng(1)
    fwd = new_cache = None
    if torch is not None:
        fwd, new_cache = torch_model(torch, model_dir)
    try:
        for n in (128, 2048, 16384):
            if time.time() > deadline:
                rep.skip("bench", f"{label} prefill {n}", "bench budget spent")
                continue
            toks = rng.integers(0, V, n).astype(np.int32)
            s = m.seq(n + 1)

            def run():
                s.prefill(toks)
                s.set_length(0)
            t = timed(run, 3 if n < 16384 else 1)
            s.close()
            row[f"prefill{n}"] = n / t
            if fwd is not None:
                cache = new_cache(n + 1)
                tt = torch.tensor(toks, dtype=torch.long, device="cuda")

                def trun():
                    with torch.no_grad():
                        fwd(tt, cache, 0)
                    torch.cuda.synchronize()
                row[f"torch_prefill{n}"] = n / timed(trun, 3 if n < 16384 else 1)
                del cache
            # the next size costs ~8-64x more: skip when it cannot fit
            if time.time() + t * (64 if n == 2048 else 20) > deadline:
                deadline_note = "estimated to exceed the bench budget"
                rep.skip("bench", f"{label} prefill sizes above {n}", deadline_note)
                break
        for ctx in (512, 8192):
            if time.time() > deadline:
                rep.skip("bench", f"{label} decode@{ctx}", "bench budget spent")
                continue
            s = m.seq(ctx + 80)
            # fill the cache by kv_write (decode time does not depend on the values)
            p = m.params
            kb = kvr.f32_to_bf16_bits((rng.standard_normal((p.num_kv_heads, ctx, p.head_dim)) * 0.5).astype(np.float32))
            for layer in range(p.num_layers):
                s.kv_write(layer, 0, kb, kb, "bf16")
            s.set_length(ctx)
            s.decode(1)  # the second identical decode step captures the graph
            s.decode(2)
            steps = 64
            t0 = time.perf_counter()
            for i in range(steps):
                s.decode(i + 3)
            row[f"decode@{ctx}"] = steps / (time.perf_counter() - t0)
            s.close()
            if fwd is not None:
                cache = new_cache(ctx + 80)
                tok = torch.tensor([3], dtype=torch.long, device="cuda")
                with torch.no_grad():
                    fwd(tok, cache, ctx)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for i in range(steps):
                        fwd(tok, cache, ctx + 1 + i)
                    torch.cuda.synchronize()
                row[f"torch_decode@{ctx}"] = steps / (time.perf_counter() - t0)
                del cache
    finally:
        m.close()
    rep.bench.append(row)
    print(f"  bench {label}: " + ", ".join(f"{k} {v:.0f}" for k, v in row.items() if k != "model"), flush=True)


def section_bench(rep, lib, budget, dut, workdir):
    """Timings only, within `budget` seconds: every step checks the deadline first and none is
    granted time beyond it (the section's process is killed at the deadline regardless)."""
    if dut != "cuda":
        rep.skip("bench", "all", "no CUDA device (dry run)")
        return
    torch, why = try_import_torch()
    if torch is None:
        rep.skip("bench", "torch eager baseline and ceilings", why)
    deadline = time.time() + budget
    if torch is not None:
        try:
            bench_ceilings(rep, torch)
        except Exception as e:  # noqa: BLE001
            rep.check("bench", "ceilings measured", False, f"raised {type(e).__name__}: {e}")
            traceback.print_exc()
    targets = [(os.path.join(ROOT, "models", d), d) for d in DEMOS]
    # (family, shape, label, extra config, seconds the shape needs at least: writing and loading
    # the checkpoint, one prefill and decode size)
    big = [("qwen3", dict(hidden=1024, inter=3072, layers=28, heads=16, kv_heads=8, head_dim=128, vocab=151936,
                          tie=True), "Qwen3-0.6B-shape", {"rope_theta": 1e6}, 40),
           # Qwen3-8B's config.json: q/k RMSNorm (family qwen3), untied lm_head, rope_theta 1e6.
           ("qwen3", dict(hidden=4096, inter=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                          tie=False), "Qwen3-8B-shape", {"rope_theta": 1e6}, 150)]
    for fam, spec, label, extra, need in big:
        if time.time() + need > deadline:
            rep.skip("bench", label, f"needs ~{need}s, {max(0.0, deadline - time.time()):.0f}s left")
            continue
        d = os.path.join(workdir, label)
        cfg = make_config(fam, **spec, **extra)
        if torch is not None:
            weights = random_weights_torch(torch, cfg)
        else:
            from reference import random_weights
            weights = random_weights(cfg, 5, scale=0.02)
        write_checkpoint(d, cfg, "BF16", 5, weights)
        del weights
        targets.append((d, label))
    for d, label in targets:
        if time.time() > deadline:
            rep.skip("bench", label, "bench budget spent")
            continue
        try:
            bench_model(rep, lib, torch, d, label, deadline)
        except Exception as e:  # noqa: BLE001
            rep.check("bench", f"{label} runs", False, f"raised {type(e).__name__}: {e}")
            traceback.print_exc()
        if label in DEMOS or label == "Qwen3-0.6B-shape":
            if time.time() > deadline:
                rep.skip("bench", f"{label} batch sweep", "bench budget spent")
                continue
            try:  # batched decode tokens/s at batch 1..64 (batch.py)
                bench_batch_sweep(rep, lib, "cuda", d, label, deadline)
            except Exception as e:  # noqa: BLE001
                rep.check("bench", f"{label} batch sweep runs", False, f"raised {type(e).__name__}: {e}")
                traceback.print_exc()
    small = [d for d, label in targets if label == "Qwen3-0.6B-shape"]
    if small and time.time() < deadline:
        try:  # device sampling µs per step at Qwen3's 151,936-token vocabulary (handoff.py)
            from handoff import bench_sampling
            bench_sampling(rep, lib, small[0], deadline)
        except Exception as e:  # noqa: BLE001
            rep.check("handoff", "device sampling timing runs", False, f"raised {type(e).__name__}: {e}")
            traceback.print_exc()
    # migration TTFT on the big random shapes (handoff.py), once both checkpoints exist
    big_dirs = [d for d, label in targets if label in ("Qwen3-0.6B-shape", "Qwen3-8B-shape")]
    if len(big_dirs) == 2 and time.time() < deadline:
        try:
            from handoff import bench_big_migration
            bench_big_migration(rep, lib, big_dirs[0], big_dirs[1], deadline)
        except Exception as e:  # noqa: BLE001
            rep.check("handoff", "big-shape migration TTFT runs", False, f"raised {type(e).__name__}: {e}")
            traceback.print_exc()


def random_weights_torch(torch, cfg):
    """bf16 weights drawn on the GPU (fast for billions of parameters), as uint16 bit patterns
    (write_safetensors stores them as they are): 2 bytes per parameter on the host."""
    from reference import random_weights
    shapes = {k: v.shape for k, v in random_weights(dict(cfg, num_hidden_layers=1, vocab_size=8), 0).items()}
    out = {}
    g = torch.Generator(device="cuda").manual_seed(5)
    H, V = cfg["hidden_size"], cfg["vocab_size"]

    def bits(a):
        return a.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)

    for i in range(cfg["num_hidden_layers"]):
        for k, shp in shapes.items():
            if k.startswith("model.layers.0."):
                name = k.replace("model.layers.0.", f"model.layers.{i}.")
                scale = 0.1 if len(shp) == 1 else 1.0 / np.sqrt(shp[1])
                a = torch.randn(shp, generator=g, device="cuda") * scale + (1.0 if len(shp) == 1 else 0.0)
                out[name] = bits(a)
    out["model.embed_tokens.weight"] = bits(torch.randn((V, H), generator=g, device="cuda") * 0.5)
    out["model.norm.weight"] = bits(1 + 0.1 * torch.randn(H, generator=g, device="cuda"))
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = bits(torch.randn((V, H), generator=g, device="cuda") / np.sqrt(H))
    return out


# ---------------------------------------------------------------- main

def machine_info():
    info = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm",
                            "--format=csv,noheader"], capture_output=True, text=True)
        info["gpu"] = p.stdout.strip()
    return info


def print_table(rep):
    print("\n==== kvrelay GPU check ====")
    for k, v in rep.info.items():
        print(f"{k}: {v}")
    if any(r.get("what") != "batch decode tok/s" for r in rep.bench):
        cols = ["prefill128", "prefill2048", "prefill16384", "decode@512", "decode@8192"]
        print(f"{'model':<20}" + "".join(f"{c:>22}" for c in cols))
        for row in rep.bench:
            if row.get("what") == "batch decode tok/s":
                continue
            if row.get("model") == "ceiling":
                print(f"{row['what']:<40} {row['kvrelay']:.0f}")
                continue
            cells = []
            for c in cols:
                v, tv = row.get(c), row.get("torch_" + c)
                cells.append("-" if v is None else (f"{v:.0f}" + (f" (torch {tv:.0f})" if tv else "")))
            print(f"{row['model']:<20}" + "".join(f"{c:>22}" for c in cells))
    sweep = [r for r in rep.bench if r.get("what") == "batch decode tok/s"]
    if sweep:
        cols = ["alone"] + [f"b{b}" for b in (1, 2, 4, 8, 16, 32, 64)]
        print("batched decode tokens/s (native greedy sampling, paged pool):")
        print(f"{'model':<20}" + "".join(f"{c:>9}" for c in cols))
        for r in sweep:
            print(f"{r['model']:<20}" + "".join(f"{r[c]:>9.0f}" if c in r else f"{'-':>9}" for c in cols))
    by = {}
    for c in rep.checks:
        s = by.setdefault(c["section"], [0, 0])
        s[0 if c["ok"] else 1] += 1
    for sec, (p, f) in by.items():
        print(f"{sec:<12} {p} passed, {f} failed")
    for c in rep.checks:
        if not c["ok"]:
            print(f"FAILED {c['section']}: {c['name']} {c['detail']}")
    if rep.skipped:
        print(f"skipped: {len(rep.skipped)} (see JSON)")
    print(f"RESULT: {rep.passed} passed, {rep.failed} failed")


# ---------------------------------------------------------------- sections in their own processes

class Terminated(Exception):
    """SIGTERM (gpu_check.sh's timeout, or the machine going back): write what was found and stop."""


class State:
    def __init__(self):
        self.children = []  # section processes running now (killed on SIGTERM)
        self.running = None  # the section in progress (gpu_check.json's `running`)
        self.terminated = False
        self.n_runs = 0
        self.t_start = time.time()


def kill_group(p):
    """Ends a section process and whatever it started (its own session: compute-sanitizer's target)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    p.wait()


def plant(args, section, arg):
    """Test hooks (gpu_check_test.ts): --plant KIND:SECTION[:ARG] makes that section's process raise,
    hang or die as a CUDA fault or a bug would."""
    for spec in args.plant:
        kind, sec, *rest = spec.split(":")
        if sec != section or (rest and rest[0] != os.path.basename(arg)):
            continue
        if kind == "raise":
            raise RuntimeError(f"planted fault in {section}")
        if kind == "hang":
            print(f"  planted hang in {section} (pid {os.getpid()})", flush=True)
            time.sleep(3600)
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)


def child_section(args):
    """One section (or one correctness model) in this process; records stream to --child-results."""
    section, arg = args.child_section, args.child_arg
    if args.sync_launches:
        kvr.DEBUG_FLAGS |= kvr.DEBUG_SYNC_LAUNCHES
    dut = "cpu" if args.dry_run else "cuda"
    with open(args.child_results, "a") as sink:
        rep = Report(sink)
        try:
            plant(args, section, arg)
            lib = kvr.open_library(args.lib)
            demos = [os.path.join(ROOT, "models", d) for d in DEMOS]
            ckpts = os.path.join(args.workdir, "checkpoints")
            if section == "correctness":
                kvs, demo, seed = args.child_kv.split(","), args.child_demo, args.child_seed
                correctness_model(rep, lib, dut, arg, kvs, demo, seed)
            elif section == "coverage":
                section_coverage(rep, lib, dut, args.workdir, os.path.join(ROOT, "models"), args.budget)
            elif section == "handoff":
                section_handoff(rep, lib, dut, args.budget, args.quick, args.workdir,
                                try_import_torch()[0] if dut == "cuda" else None)
            elif section == "batch":
                t0 = time.time()
                section_batch(rep, lib, dut, 0.7 * args.budget, args.quick, demos, test_checkpoints(ckpts))
                if dut == "cpu":  # the sweep's code path on the CPU (the GPU runs it in the bench)
                    bench_batch_sweep(rep, lib, "cpu", demos[0], "tiny-fast (cpu dry run)",
                                      max(time.time() + 5, t0 + args.budget * 0.95), 3, 8, "f32")
            elif section == "bench":
                section_bench(rep, lib, args.budget, dut, args.workdir)
        except Exception as e:  # noqa: BLE001 — a bug here or a CUDA fault: this section fails
            label = f"{section} {os.path.basename(arg)}" if arg else section
            rep.check(section, f"{label} completed", False, f"raised {type(e).__name__}: {e}")
            traceback.print_exc()
        rep.finish()
    return 0


def run_section(rep, args, state, section, timeout, arg="", extra=()):
    """Runs one section's process, killed after `timeout` s; merges its records. A process that
    dies or is killed is a failed check naming it; what it reported before stays."""
    label = f"{section} {os.path.basename(arg)}" if arg else section
    state.n_runs += 1
    results = os.path.join(args.workdir, f"results_{state.n_runs}.jsonl")
    # The section plans within 85% of its time: a step it starts near its end may still finish.
    cmd = [sys.executable, os.path.abspath(__file__), "--lib", args.lib, "--out", args.out, "--workdir",
           args.workdir, "--budget", f"{0.85 * timeout:.1f}", "--child-section", section, "--child-arg", arg,
           "--child-results", results, *extra]
    cmd += ["--dry-run"] * args.dry_run + ["--quick"] * args.quick + ["--sync-launches"] * args.sync_launches
    cmd += [x for p in args.plant for x in ("--plant", p)]
    p = subprocess.Popen(cmd, start_new_session=True)
    state.children = [p]
    print(f"== {label}: pid {p.pid}, deadline {timeout:.0f}s", flush=True)
    try:
        rc = p.wait(timeout=timeout + 5)  # + start-up
    except subprocess.TimeoutExpired:
        kill_group(p)
        rc = None
    finally:
        kill_group(p)
        state.children = []
    finished = rep.merge(results)
    if rc is None:
        rep.check(section, f"{label} finished within its deadline", False,
                  f"killed after {timeout + 5:.0f}s (a hang or an overrun); its results so far are kept")
    elif rc != 0 or not finished:
        why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        rep.check(section, f"{label} process ended normally", False,
                  f"{why} before finishing (a crash or a device fault); its results so far are kept")


def write_json(rep, args, state):
    """gpu_check.json, replaced atomically (a kill mid-write leaves the previous one)."""
    rep.info["seconds"] = round(time.time() - state.t_start, 1)
    doc = {"failed": rep.failed, "passed": rep.passed, "dry_run": args.dry_run, "running": state.running,
           "terminated": state.terminated, "info": rep.info, "checks": rep.checks, "skipped": rep.skipped,
           "bench": list(rep.bench)}
    path = os.path.join(args.out, "gpu_check.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def run_sections(rep, args, state, dut):
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS + ["probe"]]
    if unknown:
        raise SystemExit(f"unknown sections {unknown}; known: probe (always), {', '.join(SECTIONS)}")
    if args.no_bench and "bench" in sections:
        sections.remove("bench")
        rep.skip("bench", "all", "--no-bench")
    end = state.t_start + args.budget
    workdir = args.workdir
    for section in [s for s in SECTIONS if s in sections]:
        share = (end - time.time()) if section == "bench" else SHARE[section] * args.budget
        share = min(share, end - time.time())
        if share < 5:
            rep.skip(section, "all", f"the check's budget ({args.budget:.0f}s) is spent")
            continue
        state.running = section
        write_json(rep, args, state)
        if section == "correctness":
            if dut == "cuda":
                check_cublaslt_abi(rep)
            cases = correctness_cases(args.quick, workdir)
            s_end = time.time() + share
            per = max(20.0, 3 * share / len(cases))  # one hung model cannot take the section's whole time
            for i, (d, kvs, demo) in enumerate(cases):
                left = s_end - time.time()
                if left < 3:
                    rep.skip(section, f"{os.path.basename(d)}/{','.join(kvs)}", f"section budget {share:.0f}s spent")
                    continue
                run_section(rep, args, state, section, min(per, left), d,
                            ["--child-kv", ",".join(kvs), "--child-seed", str(7 + i)] + ["--child-demo"] * demo)
                write_json(rep, args, state)
        elif section == "sanitizer":
            section_sanitizer(rep, args, share, dut, state)
        else:
            run_section(rep, args, state, section, share)
    state.running = None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "native", "libkvrelay.so"))
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(tempfile.gettempdir(), "gpu_check_out"))
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated; probe always runs")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all sections together (strict)")
    ap.add_argument("--no-bench", action="store_true", help="skip the bench section (timings only)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the CPU backend stands in for the backend under test")
    ap.add_argument("--quick", action="store_true", help="f32 KV only for the generated checkpoints")
    ap.add_argument("--sync-launches", action="store_true",
                    help="synchronise after every kernel launch (outside graph capture): a fault names its kernel")
    ap.add_argument("--build-report", default="", help="gpu_check.sh's build.json (-Werror build and warnings)")
    ap.add_argument("--sanitizer", default="", help="compute-sanitizer executable (default: found on PATH)")
    for hidden, kw in (("--child", dict(action="store_true")), ("--fallback-gemm", dict(action="store_true")),
                       ("--workdir", {}), ("--child-section", {}), ("--child-arg", dict(default="")),
                       ("--child-results", {}), ("--child-kv", {}), ("--child-demo", dict(action="store_true")),
                       ("--child-seed", dict(type=int, default=7)), ("--plant", dict(action="append", default=[]))):
        ap.add_argument(hidden, help=argparse.SUPPRESS, **kw)
    args = ap.parse_args()
    if args.child:
        child_short_run(args.lib, "cpu" if args.dry_run else "cuda",
                        kvr.DEBUG_FALLBACK_GEMM if args.fallback_gemm else 0)
        return 0
    if args.child_section:
        return child_section(args)
    os.makedirs(args.out, exist_ok=True)
    state = State()
    rep = Report()

    def on_term(signum, frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, on_term)
    args.workdir = tempfile.mkdtemp(prefix="kvr_gpu_check_")
    try:
        rep.info["machine"] = machine_info()
        lib = kvr.open_library(args.lib)
        st, cuda_info = kvr.probe(lib, "cuda")
        cuda_ok = st == kvr.OK
        rep.info["cuda_probe"] = cuda_info
        check_build(rep, args.build_report)
        check_probes(rep, lib, cuda_ok, cuda_info, args.dry_run)
        if args.dry_run:
            dut = "cpu"
            print(f"dry run ({cuda_info}): the CPU backend stands in for CUDA", flush=True)
        elif not cuda_ok:
            dut = None
            print(f"STOPPED: no usable CUDA device ({cuda_info}); the sections would compare the CPU with itself",
                  flush=True)
            rep.skip("all", "every section", "stopped: no usable CUDA device (not a --dry-run)")
        else:
            dut = "cuda"
        if dut:
            run_sections(rep, args, state, dut)
    except Terminated:
        state.terminated = True
        for p in state.children:
            kill_group(p)
        rep.check(state.running or "check", "finished before SIGTERM", False,
                  f"terminated during {state.running or 'set-up'} after {time.time() - state.t_start:.0f}s")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the table and JSON are written whatever comes
        shutil.rmtree(args.workdir, ignore_errors=True)
        rep.info["seconds"] = round(time.time() - state.t_start, 1)
        print_table(rep)
        write_json(rep, args, state)
    return 1 if rep.failed or state.terminated or not any(c["ok"] for c in rep.checks) else 0


if __name__ == "__main__":
    sys.exit(main())
