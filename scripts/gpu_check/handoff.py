"""The GPU check's handoff section (docs/gpu-handoff.md), run by gpu_check.py:
  codec       the golden snapshots (tests/fixtures/golden, made by the CPU backend) imported on the
              backend under test restore the CPU's KV exactly; exporting from it reproduces every
              golden chunk frame byte for byte (f32/f16/bf16/q8/q4); a damaged frame is refused
              (CHECKSUM) and writes nothing.
  projection  demo pair tiny-fast → tiny-balanced through kvr_projector_apply_seq on the backend
              under test vs the CPU: target cache max relative difference, logits after repair(8),
              and KL(full prefill ‖ migrated) within 0.005 of the CPU's.
  timing      snapshot export/import GB/s of cache bytes (bf16, q8) at 256-token chunks of the
              Qwen3-8B KV geometry beside a pinned device→host copy; migrate + repair(8) TTFT vs a
              full target prefill for the demo pair at 4k/16k/32k tokens, and (bench_big_migration,
              called by the bench section once it has written them) for the random-weight
              Qwen3-0.6B shape → Qwen3-8B shape checkpoints.
  sampling    kvr_seq_decode_sample on the backend under test (greedy and top-k steps pick on the
              device: sm::plan_route) vs the reference: the same sequence's logits from
              kvr_seq_decode through kvr_sampler_sample with an identically seeded sampler —
              identical tokens over every step, for greedy, top-k and top-k + top-p + min-p (and a
              row-route config); timing: µs per decode_sample step vs a logits decode at the
              Qwen3 vocabulary (bench_sampling, bench section).
  fit         kvr_ridge_accumulate_seq on the demo pair (3 windows) on the backend under test vs the
              CPU: G, C, yy of keys and values within 1e-6 relative."""

import ctypes
import json
import os
import struct
import time

import numpy as np

import kvr

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden")
MODELS = os.path.join(ROOT, "models")
ENC = {"f32": 0, "f16": 1, "bf16": 2, "q8": 3, "q4": 4}
CHECKSUM = -9
P, U32, I32, SZ = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t


def bind(lib):
    """Declares the C functions this section calls beyond kvr.py's."""
    sigs = {
        "kvr_seq_chunk_bytes": (I32, [P, U32, U32, U32, P]),
        "kvr_seq_export_chunk": (I32, [P, U32, U32, U32, U32, U32, P, SZ]),
        "kvr_seq_import_chunk": (I32, [P, U32, U32, U32, U32, U32, P, SZ]),
        "kvr_seq_capacity": (U32, [P]),
        "kvr_projector_create": (I32, [P, P, P, SZ, P, SZ, P, SZ, P, SZ, P]),
        "kvr_projector_free": (None, [P]),
        "kvr_projector_apply_seq": (I32, [P, P, P, U32, U32]),
        "kvr_sampling_default_params": (None, [P]),
        "kvr_sampler_create": (I32, [P, P]),
        "kvr_sampler_free": (None, [P]),
        "kvr_sampler_last_error": (ctypes.c_char_p, [P]),
        "kvr_sampler_sample": (I32, [P, P, SZ, U32, P, P, P, P, U32, P]),
        "kvr_seq_decode_sample": (I32, [P, I32, P, U32, P, P, P, P, U32, P]),
        "kvr_ridge_create": (I32, [U32, U32, P]),
        "kvr_ridge_free": (None, [P]),
        "kvr_ridge_last_error": (ctypes.c_char_p, [P]),
        "kvr_ridge_stats": (I32, [P, P, SZ, P, SZ, P, SZ]),
        "kvr_ridge_accumulate_seq": (I32, [P, P, P, P, U32, U32]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


def chunk_bytes(seq, enc, group, tokens):
    out = ctypes.c_uint64()
    seq._check(seq.lib.kvr_seq_chunk_bytes(seq.handle, ENC[enc], group, tokens, ctypes.byref(out)),
               "kvr_seq_chunk_bytes")
    return out.value


def export_chunk(seq, enc, group, index, start, tokens, frame=None):
    n = chunk_bytes(seq, enc, group, tokens)
    if frame is None:
        frame = np.empty(n, np.uint8)
    seq._check(seq.lib.kvr_seq_export_chunk(seq.handle, ENC[enc], group, index, start, tokens,
                                            frame.ctypes.data, n), "kvr_seq_export_chunk")
    return frame


def import_chunk_status(seq, enc, group, index, start, tokens, frame):
    frame = np.ascontiguousarray(frame, np.uint8)
    return seq.lib.kvr_seq_import_chunk(seq.handle, ENC[enc], group, index, start, tokens, frame.ctypes.data,
                                        frame.size)


def frames_of(data, seq, enc, group, tokens, chunk_tokens):
    """The chunk frames of an unsigned snapshot: (index, start, count, bytes)."""
    (header_length,) = struct.unpack_from("<I", data, 16)
    o = 24 + header_length
    out = []
    for i, start in enumerate(range(0, tokens, chunk_tokens)):
        count = min(chunk_tokens, tokens - start)
        n = chunk_bytes(seq, enc, group, count)
        out.append((i, start, count, np.frombuffer(data, np.uint8, n, o)))
        o += n
    assert o == len(data), f"snapshot of {len(data)} bytes, frames end at {o}"
    return out


def read_all(seq, layers, count):
    return [np.concatenate([a.ravel() for a in seq.kv_read(layer, 0, count, "f32")]) for layer in range(layers)]


def check_codec(rep, lib, dut):
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        manifest = json.load(f)
    model_dir = os.path.join(MODELS, manifest["model"])
    T, C = manifest["tokens"], manifest["chunkTokens"]
    golden = {c["file"]: open(os.path.join(GOLDEN, c["file"]), "rb").read() for c in manifest["cases"]}
    for cache in ("f32", "bf16"):
        models = {b: kvr.Model(lib, model_dir, cache, b, n_threads=2) for b in ("cpu", dut)}
        layers = models["cpu"].params.num_layers
        try:
            # The golden KV: the f32 golden file's chunks, imported (rounded to this cache's type).
            seqs = {}
            for b, m in models.items():
                s = m.seq(T)
                for i, start, count, fr in frames_of(golden["f32cache-f32.kvs"], s, "f32", 0, T, C):
                    st = import_chunk_status(s, "f32", 0, i, start, count, fr)
                    s._check(st, "kvr_seq_import_chunk")
                seqs[b] = s
            same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                       for a, b in zip(read_all(seqs["cpu"], layers, T), read_all(seqs[dut], layers, T)))
            rep.check("handoff", f"codec {cache} cache: golden f32 import equals the CPU's KV", same)
            for case in (c for c in manifest["cases"] if c["cacheDtype"] == cache):
                enc, group = case["encoding"], case["groupSize"]
                frames = frames_of(golden[case["file"]], seqs[dut], enc, group, T, C)
                diff = []
                for i, start, count, want in frames:
                    got = export_chunk(seqs[dut], enc, group, i, start, count)
                    if not np.array_equal(got, want):
                        diff.append(f"chunk {i}: {int(np.count_nonzero(got != want))} bytes differ")
                rep.check("handoff", f"codec export {case['file']} byte-identical to the golden file", not diff,
                          "; ".join(diff))
                # import of the golden file on both backends: the same KV
                imported = {}
                for b, m in models.items():
                    s = m.seq(T)
                    for i, start, count, fr in frames:
                        s._check(import_chunk_status(s, enc, group, i, start, count, fr), "kvr_seq_import_chunk")
                    imported[b] = read_all(s, layers, T)
                    s.close()
                same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                           for a, b in zip(imported["cpu"], imported[dut]))
                rep.check("handoff", f"codec import {case['file']} restores the CPU's KV", same)
            # a damaged frame: CHECKSUM, nothing written, length unchanged
            i, start, count, fr = frames_of(golden["f32cache-q8.kvs"], seqs[dut], "q8", 0, T, C)[0]
            bad = fr.copy()
            bad[40] ^= 1
            s = models[dut].seq(T)
            st = import_chunk_status(s, "q8", 0, i, start, count, bad)
            s.set_length(count)
            untouched = all(not np.any(x) for x in read_all(s, layers, count))
            rep.check("handoff", f"codec {cache} cache: a damaged q8 frame is refused and writes nothing",
                      st == CHECKSUM and untouched, f"status {st}")
            s.close()
            for s in seqs.values():
                s.close()
        finally:
            for m in models.values():
                m.close()


def projector_weights(lib, pdir, src, dst):
    """Full (n_tgt, n_src) f32 matrices and biases of a linear projector directory."""
    with open(os.path.join(pdir, "projector.json")) as f:
        meta = json.load(f)
    wfile = os.path.join(pdir, "weights.safetensors")
    sp, tp = src.params, dst.params
    s_layer = sp.num_kv_heads * sp.head_dim
    t_layer = tp.num_kv_heads * tp.head_dim
    n_src, n_tgt = sp.num_layers * s_layer, tp.num_layers * t_layer
    out = {}
    for kind in ("k", "v"):
        w = np.zeros((n_tgt, n_src), np.float32)
        b = np.zeros(n_tgt, np.float32)
        for row in meta["layer_map"]:
            tl = row["target_layer"]
            lw = _tensor(wfile, f"layers.{tl}.{kind}.weight")
            lb = _tensor(wfile, f"layers.{tl}.{kind}.bias")
            for j, sl in enumerate(row[f"{kind}_source_layers"]):
                w[tl * t_layer:(tl + 1) * t_layer, sl * s_layer:(sl + 1) * s_layer] = \
                    lw[:, j * s_layer:(j + 1) * s_layer]
            b[tl * t_layer:(tl + 1) * t_layer] = lb
        out[kind] = (w, b)
    return out


def _tensor(path, name):
    header, base = kvr.read_header(path)
    t = header[name]
    a, b = t["data_offsets"]
    return np.fromfile(path, np.uint8, count=b - a, offset=base + a).view(np.float32).reshape(t["shape"])


def make_projector(lib, src, dst, weights):
    (wk, bk), (wv, bv) = weights["k"], weights["v"]
    out = ctypes.c_void_p()
    st = lib.kvr_projector_create(ctypes.byref(src.params), ctypes.byref(dst.params), wk.ctypes.data, wk.size,
                                  bk.ctypes.data, bk.size, wv.ctypes.data, wv.size, bv.ctypes.data, bv.size,
                                  ctypes.byref(out))
    if st != kvr.OK:
        raise kvr.EngineError(st, lib.kvr_last_error().decode(), "kvr_projector_create")
    return out


def migrate(lib, proj, src_model, dst_model, tokens, repair, warm_src=None):
    """Projects tokens[:-repair] from a (warm) source sequence, then the target prefills the last
    `repair` tokens: returns (logits of the last token, seconds of projection + repair)."""
    n = len(tokens)
    src = warm_src
    if src is None:
        src = src_model.seq(n)
        src.prefill(tokens[: n - repair])
    dst = dst_model.seq(n + 1)
    t0 = time.perf_counter()
    st = lib.kvr_projector_apply_seq(proj, src.handle, dst.handle, n - repair, 0)
    if st != kvr.OK:
        raise kvr.EngineError(st, lib.kvr_seq_last_error(dst.handle).decode(), "kvr_projector_apply_seq")
    logits = dst.prefill(tokens[n - repair:])[0]
    dt = time.perf_counter() - t0
    dst.close()
    if warm_src is None:
        src.close()
    return logits, dt


def kl(p_logits, q_logits):
    def logsoft(x):
        x = x.astype(np.float64) - np.max(x)
        return x - np.log(np.sum(np.exp(x)))
    lp, lq = logsoft(p_logits), logsoft(q_logits)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def check_projection(rep, lib, dut):
    pdir = os.path.join(MODELS, "projectors", "tiny-fast--tiny-balanced")
    res = {}
    rng = np.random.default_rng(9)
    tokens = rng.integers(0, 4000, 200).astype(np.int32)
    for b in ("cpu", dut):
        src = kvr.Model(lib, os.path.join(MODELS, "tiny-fast"), "f32", b, n_threads=2)
        dst = kvr.Model(lib, os.path.join(MODELS, "tiny-balanced"), "f32", b, n_threads=2)
        proj = make_projector(lib, src, dst, projector_weights(lib, pdir, src, dst))
        try:
            s = src.seq(len(tokens))
            s.prefill(tokens[:-8])
            t = dst.seq(len(tokens))
            st = lib.kvr_projector_apply_seq(proj, s.handle, t.handle, len(tokens) - 8, 0)
            if st != kvr.OK:
                raise kvr.EngineError(st, lib.kvr_seq_last_error(t.handle).decode(), "kvr_projector_apply_seq")
            cache = read_all(t, dst.params.num_layers, len(tokens) - 8)
            migrated = t.prefill(tokens[-8:])[0]
            full_seq = dst.seq(len(tokens))
            full = full_seq.prefill(tokens)[0]
            res[b] = (cache, migrated, kl(full, migrated))
            for x in (s, t, full_seq):
                x.close()
        finally:
            lib.kvr_projector_free(proj)
            src.close()
            dst.close()
    cache_diff = max(float(np.max(np.abs(a - c)) / max(np.max(np.abs(c)), 1e-30))
                     for a, c in zip(res[dut][0], res["cpu"][0]))
    rep.check("handoff", "projection demo pair: target cache vs CPU (max rel diff)", cache_diff <= 1e-4,
              f"{cache_diff:.2e}")
    logit_diff = float(np.max(np.abs(res[dut][1] - res["cpu"][1])) / np.max(np.abs(res["cpu"][1])))
    rep.check("handoff", "projection demo pair: logits after repair(8) vs CPU", logit_diff <= 1e-3,
              f"{logit_diff:.2e}")
    dkl = abs(res[dut][2] - res["cpu"][2])
    rep.check("handoff", "projection demo pair: KL(full ‖ migrated) within 0.005 of the CPU's", dkl <= 0.005,
              f"{res[dut][2]:.4f} vs {res['cpu'][2]:.4f}")


class SamplingParams(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_double), ("top_p", ctypes.c_double), ("min_p", ctypes.c_double),
                ("seed", ctypes.c_int64), ("top_k", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


def make_sampler(lib, temperature, top_k=0, top_p=1.0, min_p=0.0, seed=0):
    p = SamplingParams()
    lib.kvr_sampling_default_params(ctypes.byref(p))
    p.temperature, p.top_k, p.top_p, p.min_p, p.seed = temperature, top_k, top_p, min_p, seed
    out = ctypes.c_void_p()
    st = lib.kvr_sampler_create(ctypes.byref(p), ctypes.byref(out))
    if st != kvr.OK:
        raise kvr.EngineError(st, lib.kvr_last_error().decode(), "kvr_sampler_create")
    return out


def decode_sample(seq, token, sampler):
    out = ctypes.c_int32()
    seq._check(seq.lib.kvr_seq_decode_sample(seq.handle, int(token), sampler, seq.m.vocab, ctypes.byref(out), None,
                                             None, None, 0, None), "kvr_seq_decode_sample")
    return out.value


def sample_logits(lib, sampler, logits):
    out = ctypes.c_int32()
    st = lib.kvr_sampler_sample(sampler, logits.ctypes.data, logits.size, logits.size, ctypes.byref(out), None,
                                None, None, 0, None)
    if st != kvr.OK:
        raise kvr.EngineError(st, lib.kvr_sampler_last_error(sampler).decode(), "kvr_sampler_sample")
    return out.value


SAMPLING_CONFIGS = [("greedy", dict(temperature=0.0)),
                    ("top_k 40, T 0.8", dict(temperature=0.8, top_k=40, seed=11)),
                    ("top_k 64, T 1.2, top_p 0.9, min_p 0.05", dict(temperature=1.2, top_k=64, top_p=0.9,
                                                                      min_p=0.05, seed=-3)),
                    ("top_k 1, T 1", dict(temperature=1.0, top_k=1, seed=5)),
                    ("T 0.9 (row route)", dict(temperature=0.9, seed=7))]


def check_sampling(rep, lib, dut, steps=24, model_dir=None, section="handoff", label=""):
    """decode_sample on the backend under test vs the reference sampler on the same logits: two
    sequences of one model (tiny-fast unless model_dir) fed the same tokens; one samples in the step
    (device route), the other decodes logits and samples them with kvr_sampler_sample (an
    identically seeded sampler)."""
    model = kvr.Model(lib, model_dir or os.path.join(MODELS, "tiny-fast"), "f32", dut, n_threads=2)
    prompt = np.random.default_rng(5).integers(0, min(4000, model.vocab), 40).astype(np.int32)
    try:
        for name, cfg in SAMPLING_CONFIGS:
            a, b = model.seq(len(prompt) + steps + 1), model.seq(len(prompt) + steps + 1)
            sa, sb = make_sampler(lib, **cfg), make_sampler(lib, **cfg)
            try:
                a.prefill(prompt[:-1])
                b.prefill(prompt[:-1])
                tok, same, first_bad = int(prompt[-1]), 0, None
                for i in range(steps):
                    got = decode_sample(a, tok, sa)
                    want = sample_logits(lib, sb, b.decode(tok))
                    if got == want:
                        same += 1
                    elif first_bad is None:
                        first_bad = f"step {i}: {got} vs {want}"
                    tok = want
                rep.check(section, f"{label}device sampling vs the reference sampler: {name}", same == steps,
                          f"{same}/{steps} identical" + (f", first difference {first_bad}" if first_bad else ""))
            finally:
                lib.kvr_sampler_free(sa)
                lib.kvr_sampler_free(sb)
                a.close()
                b.close()
    finally:
        model.close()


def bench_sampling(rep, lib, model_dir, deadline, steps=64):
    """µs per decode step at the checkpoint's vocabulary (the bench's Qwen3-0.6B shape: 151,936):
    kvr_seq_decode (copies the f32 row to the host) vs kvr_seq_decode_sample greedy and top-k 50
    (pick on the device, ≤ 64 candidates back) and plain temperature (row route). Called by
    gpu_check.py's bench section."""
    model = kvr.Model(lib, model_dir, "bf16", "cuda")
    try:
        row = {"what": f"decode step at vocab {model.vocab}, {os.path.basename(model_dir)}"}
        for name, cfg in (("decode_logits", None), ("greedy", dict(temperature=0.0)),
                          ("top_k50", dict(temperature=0.8, top_k=50, seed=1)),
                          ("temperature_row", dict(temperature=0.8, seed=1))):
            if time.time() > deadline:
                break
            seq = model.seq(512 + 8 + steps)  # prompt, warm-up, timed steps
            sampler = make_sampler(lib, **cfg) if cfg else None
            try:
                seq.prefill(np.arange(512, dtype=np.int32) % model.vocab)
                for _ in range(8):  # warm-up: graph capture, staging allocation
                    seq.decode(1) if cfg is None else decode_sample(seq, 1, sampler)
                t0 = time.perf_counter()
                for _ in range(steps):
                    seq.decode(1) if cfg is None else decode_sample(seq, 1, sampler)
                row[f"{name}_us"] = (time.perf_counter() - t0) / steps * 1e6
            finally:
                if sampler:
                    lib.kvr_sampler_free(sampler)
                seq.close()
        if "greedy_us" in row:
            row["device_greedy_minus_logits_decode_us"] = row["greedy_us"] - row["decode_logits_us"]
        _bench(rep, row)
    finally:
        model.close()


def fit_stats(lib, backend, windows, n_tokens):
    """kvr_ridge_accumulate_seq over the demo pair tiny-fast → tiny-balanced on `backend`: the
    keys' and values' (G, C, yy) after every window."""
    src = kvr.Model(lib, os.path.join(MODELS, "tiny-fast"), "f32", backend, n_threads=2)
    dst = kvr.Model(lib, os.path.join(MODELS, "tiny-balanced"), "f32", backend, n_threads=2)
    sp, tp = src.params, dst.params
    n_in = sp.num_layers * sp.num_kv_heads * sp.head_dim
    n_out = tp.num_layers * tp.num_kv_heads * tp.head_dim
    ridges = [ctypes.c_void_p(), ctypes.c_void_p()]
    try:
        for r in ridges:
            if lib.kvr_ridge_create(n_in, n_out, ctypes.byref(r)) != kvr.OK:
                raise kvr.EngineError(-1, lib.kvr_last_error().decode(), "kvr_ridge_create")
        for w in windows:
            s, t = src.seq(n_tokens), dst.seq(n_tokens)
            try:
                s.prefill(w)
                t.prefill(w)
                st = lib.kvr_ridge_accumulate_seq(ridges[0], ridges[1], s.handle, t.handle, len(w), 0)
                if st != kvr.OK:
                    raise kvr.EngineError(st, lib.kvr_ridge_last_error(ridges[0]).decode(), "kvr_ridge_accumulate_seq")
            finally:
                s.close()
                t.close()
        out = []
        for r in ridges:
            g, c, yy = np.empty((n_in + 1) ** 2), np.empty((n_in + 1) * n_out), np.empty(n_out)
            st = lib.kvr_ridge_stats(r, g.ctypes.data, g.size, c.ctypes.data, c.size, yy.ctypes.data, yy.size)
            if st != kvr.OK:
                raise kvr.EngineError(st, lib.kvr_ridge_last_error(r).decode(), "kvr_ridge_stats")
            out.append((g, c, yy))
        return out
    finally:
        for r in ridges:
            if r:
                lib.kvr_ridge_free(r)
        src.close()
        dst.close()


def check_fit(rep, lib, dut):
    """Fit statistics accumulated on the backend under test (kvr_ridge_accumulate_seq: on the
    device, f64 sums of exact products) vs the CPU's on the same windows. The features can differ
    in rare elements by one f32 rounding (device de-rotation cos/sin), so the bound is relative:
    max |Δ| / max |stat| <= 1e-6 per statistic (G, C, yy of keys and values)."""
    rng = np.random.default_rng(13)
    windows = [rng.integers(0, 4000, n).astype(np.int32) for n in (256, 256, 100)]
    res = {b: fit_stats(lib, b, windows, 256) for b in ("cpu", dut)}
    for kv, part in ((0, "keys"), (1, "values")):
        for i, name in enumerate(("G = Σ xᵀx", "C = Σ xᵀy", "yy = Σ y²")):
            a, c = res[dut][kv][i], res["cpu"][kv][i]
            rel = float(np.max(np.abs(a - c)) / max(float(np.max(np.abs(c))), 1e-300))
            rep.check("handoff", f"fit statistics vs CPU: {part} {name} (max rel diff)", rel <= 1e-6, f"{rel:.2e}")


def random_kv_model(workdir):
    """A checkpoint with Qwen3-8B's KV geometry (36 layers, 8 kv heads, head_dim 128) and a tiny
    hidden size: only its cache matters to the codec timing."""
    from reference import make_config, write_checkpoint
    d = os.path.join(workdir, "kv8b")
    if not os.path.exists(os.path.join(d, "config.json")):
        cfg = make_config("qwen3", hidden=256, inter=256, layers=36, heads=16, kv_heads=8, head_dim=128,
                          vocab=512, tie=True)
        write_checkpoint(d, cfg, "BF16", seed=3)
    return d


def bench_codec(rep, lib, dut, torch, workdir, deadline):
    try:
        mdir = random_kv_model(workdir)
    except Exception as e:  # noqa: BLE001 — reported, not fatal
        rep.skip("handoff", "codec GB/s", f"could not make the 8B-geometry checkpoint: {e}")
        return
    m = kvr.Model(lib, mdir, "bf16", dut, n_threads=0)
    try:
        T = 256
        s = m.seq(T)
        p = m.params
        rng = np.random.default_rng(1)
        for layer in range(p.num_layers):
            k = rng.standard_normal((p.num_kv_heads, T, p.head_dim), np.float32)
            s.kv_write(layer, 0, k, k * 0.5, "f32")
        s.set_length(T)
        cache_bytes = 2 * p.num_layers * p.num_kv_heads * T * p.head_dim * 2
        for enc in ("bf16", "q8"):
            if time.time() > deadline:
                rep.skip("handoff", f"codec {enc} GB/s", "budget spent")
                continue
            frame = np.empty(chunk_bytes(s, enc, 0, T), np.uint8)
            export_chunk(s, enc, 0, 0, 0, T, frame)
            t0, reps = time.perf_counter(), 5
            for _ in range(reps):
                export_chunk(s, enc, 0, 0, 0, T, frame)
            ex = (time.perf_counter() - t0) / reps
            dst = m.seq(T)
            t0 = time.perf_counter()
            for _ in range(reps):
                dst.lib.kvr_seq_set_length(dst.handle, 0)
                dst._check(import_chunk_status(dst, enc, 0, 0, 0, T, frame), "kvr_seq_import_chunk")
            im = (time.perf_counter() - t0) / reps
            dst.close()
            row = {"what": f"snapshot {enc} 256-token chunk, 8B KV geometry ({cache_bytes / 2**20:.1f} MiB cache)",
                   "export_GBps": cache_bytes / ex / 1e9, "import_GBps": cache_bytes / im / 1e9}
            _bench(rep, row)
        if torch is not None and dut == "cuda":
            x = torch.empty(cache_bytes, dtype=torch.uint8, device="cuda")
            h = torch.empty(cache_bytes, dtype=torch.uint8, pin_memory=True)
            h.copy_(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                h.copy_(x)
            torch.cuda.synchronize()
            row = {"what": "pinned device→host copy, same bytes", "GBps": cache_bytes * 10 / (time.perf_counter() - t0) / 1e9}
            _bench(rep, row)
        s.close()
    finally:
        m.close()


def _bench(rep, row):
    """A timing row of this section (its own list: the bench table has another shape)."""
    rep.info.setdefault("handoff_timing", []).append(row)
    print("  [time] " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
          flush=True)


def bench_migration(rep, lib, dut, deadline):
    pdir = os.path.join(MODELS, "projectors", "tiny-fast--tiny-balanced")
    sizes = [4096, 16384, 32768]
    src = kvr.Model(lib, os.path.join(MODELS, "tiny-fast"), "bf16", dut, n_threads=0)
    dst = kvr.Model(lib, os.path.join(MODELS, "tiny-balanced"), "bf16", dut, n_threads=0)
    proj = make_projector(lib, src, dst, projector_weights(lib, pdir, src, dst))
    rng = np.random.default_rng(4)
    try:
        last = None  # (tokens, seconds) of the size before: the next one's estimate
        for n in sizes:
            # prefill cost grows faster than the tokens (attention): estimate quadratically
            need = 0.0 if last is None else last[1] * (n / last[0]) ** 2
            if time.time() + need > deadline:
                rep.skip("handoff", f"migration TTFT demo pair at {n}",
                         f"needs ~{need:.0f}s, {max(0.0, deadline - time.time()):.0f}s left")
                continue
            t_size = time.perf_counter()
            tokens = rng.integers(0, 4000, n).astype(np.int32)
            warm = src.seq(n)
            warm.prefill(tokens[: n - 8])
            _, t_mig = migrate(lib, proj, src, dst, tokens, 8, warm)
            full = dst.seq(n)
            t0 = time.perf_counter()
            full.prefill(tokens)
            t_full = time.perf_counter() - t0
            full.close()
            warm.close()
            row = {"what": f"demo pair tiny-fast→tiny-balanced, {n} tokens", "migrate_repair8_s": t_mig,
                   "full_prefill_s": t_full, "speedup": t_full / t_mig}
            _bench(rep, row)
            last = (n, time.perf_counter() - t_size)
    finally:
        lib.kvr_projector_free(proj)
        src.close()
        dst.close()


def bench_big_migration(rep, lib, src_dir, dst_dir, deadline):
    """migrate + repair(8) TTFT vs full target prefill on the random-weight big shapes the bench
    section wrote (Qwen3-0.6B shape → Qwen3-8B shape), with a random all-layers linear projector
    (timing only: random weights carry no quality). Called by gpu_check.py's bench section."""
    src = kvr.Model(lib, src_dir, "bf16", "cuda")
    dst = kvr.Model(lib, dst_dir, "bf16", "cuda")
    try:
        sp, tp = src.params, dst.params
        n_src = sp.num_layers * sp.num_kv_heads * sp.head_dim
        n_tgt = tp.num_layers * tp.num_kv_heads * tp.head_dim
        rng = np.random.default_rng(7)
        w = {k: ((rng.standard_normal((n_tgt, n_src), np.float32) / np.float32(np.sqrt(n_src))),
                 np.zeros(n_tgt, np.float32)) for k in ("k", "v")}
        proj = make_projector(lib, src, dst, w)
        del w
        try:
            last = None  # (tokens, seconds) of the size before, as in bench_migration
            for n in (4096, 16384, 32768):
                need = 0.0 if last is None else last[1] * (n / last[0]) ** 2
                if time.time() + need > deadline:
                    rep.skip("handoff", f"migration TTFT big shapes at {n}",
                             f"needs ~{need:.0f}s, {max(0.0, deadline - time.time()):.0f}s left")
                    continue
                t_size = time.perf_counter()
                tokens = rng.integers(0, min(sp.vocab_size, tp.vocab_size), n).astype(np.int32)
                warm = src.seq(n)
                warm.prefill(tokens[: n - 8])
                migrate(lib, proj, src, dst, tokens[:1024], 8, None)  # first use uploads the weights
                _, t_mig = migrate(lib, proj, src, dst, tokens, 8, warm)
                full = dst.seq(n)
                t0 = time.perf_counter()
                full.prefill(tokens)
                t_full = time.perf_counter() - t0
                full.close()
                warm.close()
                _bench(rep, {"what": f"{os.path.basename(src_dir)} → {os.path.basename(dst_dir)}, {n} tokens",
                             "migrate_repair8_s": t_mig, "full_prefill_s": t_full, "speedup": t_full / t_mig})
                last = (n, time.perf_counter() - t_size)
        finally:
            lib.kvr_projector_free(proj)
    finally:
        src.close()
        dst.close()


def section_handoff(rep, lib, dut, budget, quick, workdir, torch=None):
    bind(lib)
    deadline = time.time() + budget
    for name, fn in (("codec", lambda: check_codec(rep, lib, dut)),
                     ("projection", lambda: check_projection(rep, lib, dut)),
                     ("sampling", lambda: check_sampling(rep, lib, dut)),
                     ("fit", lambda: check_fit(rep, lib, dut))):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 — one failed check, the rest still run
            rep.check("handoff", f"{name} ran", False, f"{type(e).__name__}: {e}")
    for name, fn in (("codec GB/s", lambda: bench_codec(rep, lib, dut, torch, workdir, deadline)),
                     ("migration TTFT", lambda: bench_migration(rep, lib, dut, deadline))):
        if quick:
            rep.skip("handoff", name, "--quick: timing skipped")
            continue
        if time.time() > deadline:
            rep.skip("handoff", name, "budget spent")
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            rep.check("handoff", f"{name} ran", False, f"{type(e).__name__}: {e}")
