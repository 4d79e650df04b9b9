"""The GPU check's coverage section: paths the correctness section's small models never reach, each
compared with the CPU backend (the bench only times them). Run by gpu_check.py in its own process.

  vocab     Qwen's 151,936-token vocabulary on a one-layer model: logits vs the CPU backend, and
            device sampling (greedy and top-k: the multi-segment candidate reduction) vs the
            reference sampler on the same sequence's logits, token for token.
  long      a 600-token prefill (attention over many key tiles and row blocks), continued in chunks
            to a 4,096-token context, then decodes there (key splits at their cap), f32 and f16 KV,
            every compared row vs the CPU backend.
  fallback  the mma.sync GEMM forced where cuBLASLt loaded (KVR_DEBUG_FALLBACK_GEMM): prefill at
            every position and chunked, vs the CPU backend.
  gemv      BF16 weights whose input sizes are not a multiple of 8 (hidden 68, intermediate 100):
            the GEMV's scalar path, and odd K in the prefill GEMMs; prefill and decodes vs the CPU."""

import os
import time

import numpy as np

import kvr
from handoff import bind, check_sampling
from reference import make_config, write_checkpoint

F32_BOUND, HALF_BOUND = 1e-3, 5e-3  # gpu_check.py's bounds: f32 KV, 16-bit KV
SECTION = "coverage"

SPECS = {
    "vocab": ("qwen3", "BF16", dict(hidden=64, inter=128, layers=1, heads=2, kv_heads=1, head_dim=64,
                                    vocab=151936, tie=True)),
    "long": ("llama", "BF16", dict(hidden=128, inter=256, layers=2, heads=4, kv_heads=1, head_dim=64, vocab=512,
                                   tie=False)),
    "gemv": ("llama", "BF16", dict(hidden=68, inter=100, layers=2, heads=2, kv_heads=1, head_dim=32, vocab=300,
                                   tie=False)),
}


def ratio(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = np.abs(a - ref)
    if not np.all(np.isfinite(d)):
        return float("inf")
    return float(d.max() / max(np.abs(ref).max(), 1e-30))


def checkpoint(workdir, name):
    d = os.path.join(workdir, "coverage", name)
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        fam, dt, spec = SPECS[name]
        write_checkpoint(d, make_config(fam, **spec), dt, seed=200 + len(name))
    return d


def check_vocab(rep, lib, dut, workdir):
    d = checkpoint(workdir, "vocab")
    rng = np.random.default_rng(21)
    prompt = rng.integers(0, 151936, 24).astype(np.int32)
    cpu, m = kvr.Model(lib, d, "f32", "cpu"), kvr.Model(lib, d, "f32", dut)
    try:
        a, b = cpu.seq(64), m.seq(64)
        r = ratio(b.prefill(prompt, True), a.prefill(prompt, True))
        for t in rng.integers(0, 151936, 4):
            r = max(r, ratio(b.decode(t), a.decode(t)))
        rep.check(SECTION, "vocab 151936: prefill + 4 decodes vs cpu", r < F32_BOUND, f"ratio {r:.2e}")
        a.close()
        b.close()
    finally:
        cpu.close()
        m.close()
    check_sampling(rep, lib, dut, steps=8, model_dir=d, section=SECTION, label="vocab 151936 ")


def check_long(rep, lib, dut, workdir, kv, deadline):
    d = checkpoint(workdir, "long")
    name = f"long context/{kv}"
    bound = F32_BOUND if kv == "f32" else HALF_BOUND
    rng = np.random.default_rng(22)
    T, ctx, D = 600, 4096, 8
    toks = rng.integers(0, 512, ctx + D).astype(np.int32)
    cpu, m = kvr.Model(lib, d, kv, "cpu"), kvr.Model(lib, d, kv, dut)
    try:
        a, b = cpu.seq(ctx + D + 1), m.seq(ctx + D + 1)
        r = ratio(b.prefill(toks[:T], True), a.prefill(toks[:T], True))
        rep.check(SECTION, f"{name}: prefill {T} (every position) vs cpu", r < bound, f"ratio {r:.2e}")
        if time.time() > deadline:
            rep.skip(SECTION, f"{name}: context {ctx}", "section budget spent")
            return
        r = 0.0
        for s0 in range(T, ctx, 1000):
            s1 = min(ctx, s0 + 1000)
            r = max(r, ratio(b.prefill(toks[s0:s1]), a.prefill(toks[s0:s1])))
        rep.check(SECTION, f"{name}: chunked prefill to {ctx}, last logits vs cpu", r < bound, f"ratio {r:.2e}")
        r = max(ratio(b.decode(t), a.decode(t)) for t in toks[ctx:])
        rep.check(SECTION, f"{name}: {D} decodes at context {ctx} vs cpu", r < bound, f"ratio {r:.2e}")
        a.close()
        b.close()
    finally:
        cpu.close()
        m.close()


def prefill_vs_cpu(rep, lib, dut, model_dir, label, debug, decodes=0):
    """Prefill at every position, chunked 7+13+20, and `decodes` decodes on dut (with the KVR_DEBUG_*
    flags `debug`) vs the CPU backend."""
    V = kvr.load_config(model_dir)["vocab_size"]
    rng = np.random.default_rng(23)
    toks = rng.integers(0, V, 40 + decodes).astype(np.int32)
    cpu, m = kvr.Model(lib, model_dir, "f32", "cpu"), kvr.Model(lib, model_dir, "f32", dut, debug=debug)
    try:
        a, b, c = cpu.seq(64), m.seq(64), m.seq(64)
        want = a.prefill(toks[:40], True)
        r = ratio(b.prefill(toks[:40], True), want)
        rep.check(SECTION, f"{label}: prefill 40 (every position) vs cpu", r < F32_BOUND, f"ratio {r:.2e}")
        got = np.concatenate([c.prefill(toks[x:y], True) for x, y in ((0, 7), (7, 20), (20, 40))])
        r = ratio(got, want)
        rep.check(SECTION, f"{label}: chunked prefill 7+13+20 vs cpu", r < F32_BOUND, f"ratio {r:.2e}")
        if decodes:
            r = max(ratio(b.decode(t), a.decode(t)) for t in toks[40:])
            rep.check(SECTION, f"{label}: {decodes} decodes vs cpu", r < F32_BOUND, f"ratio {r:.2e}")
        for s in (a, b, c):
            s.close()
    finally:
        cpu.close()
        m.close()


def section_coverage(rep, lib, dut, workdir, models_root, budget):
    bind(lib)  # the sampler entry points' signatures
    deadline = time.time() + budget
    steps = [
        ("vocab", lambda: check_vocab(rep, lib, dut, workdir)),
        ("long context f32", lambda: check_long(rep, lib, dut, workdir, "f32", deadline)),
        ("long context f16", lambda: check_long(rep, lib, dut, workdir, "f16", deadline)),
        ("fallback GEMM", lambda: [prefill_vs_cpu(rep, lib, dut, d, f"fallback GEMM {os.path.basename(d)}",
                                                  kvr.DEBUG_FALLBACK_GEMM)
                                   for d in (os.path.join(models_root, "tiny-fast"), checkpoint(workdir, "long"))]),
        ("scalar GEMV", lambda: prefill_vs_cpu(rep, lib, dut, checkpoint(workdir, "gemv"),
                                               "hidden 68 / intermediate 100 (scalar GEMV)", 0, decodes=8)),
    ]
    for name, fn in steps:
        if time.time() > deadline:
            rep.skip(SECTION, name, "section budget spent")
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001 — one failed check; the next step still runs
            rep.check(SECTION, f"{name} ran", False, f"raised {type(e).__name__}: {e}")
