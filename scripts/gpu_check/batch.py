"""The GPU check's batched-step section (CUDA): kvr_batch_step / kvr_batch_step_sample on
the backend under test (the CPU in a dry run) over paged and contiguous sequences.

  batched vs alone  random compositions (prefill chunks and decodes mixed, sequences joining late,
                    paged and contiguous sequences in one step) on the demo models (f32 and bf16 KV)
                    and the generated checkpoints: every row a step returns vs the same position of
                    that sequence run alone (kvr_seq_prefill / kvr_seq_decode), within BATCH_BOUND;
                    greedy generation in batched steps = alone, token for token; native sampling in
                    the step (greedy and seeded top-k, drawn on the device where the backend can)
                    = the same sampler drawing from the alone logits.
  pool              a small paged pool: a step needing more blocks than are free fails with
                    KVR_ERR_POOL_EXHAUSTED and changes nothing (lengths, free blocks, the other
                    sequences' next logits bit for bit); freeing returns every block.
  paged alone       a paged sequence's own calls vs a contiguous twin: prefill (every position),
                    decodes, greedy decode_sample; KV written across block boundaries reads back
                    bit for bit; snapshot chunks exported from it are byte-identical to the
                    contiguous twin's and import into a paged sequence bit for bit; a linear
                    projection (kvr_projector_apply_seq) into a paged target and from a paged source
                    writes the same bits as with contiguous ones.
  sweep             decode tokens/s of batched steps at batch 1, 2, 4, 8, 16, 32, 64 (native greedy
                    sampling, paged pool, context ~96) beside the single-sequence decode
                    (bench_batch_sweep; run from the bench section on the demo models and the
                    random-weight Qwen3-0.6B shape)."""

import ctypes
import os
import time

import numpy as np

import kvr
from handoff import (MODELS, bind as bind_handoff, decode_sample, export_chunk, import_chunk_status, make_projector,
                     make_sampler, projector_weights, sample_logits)

# Batched vs alone bound: the CPU test's bf16-cache bound (lib/native/batch_test.ts REL_TOL_BF16),
# for both caches. On CUDA a batched decode row goes through the bf16 hi/lo-split tensor-core GEMM
# where the alone decode uses the exact-f32 GEMV, so the f32 cache cannot expect the CPU's 1e-5
# (summation order only); any real mix-up (wrong cache, row or position) is O(1).
BATCH_BOUND = 1e-4
POOL_EXHAUSTED = -10


def bind(lib):
    """Signatures of the pool and batched-step entry points (plus the handoff ones for samplers)."""
    bind_handoff(lib)
    P, U32, I32, SZ = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
    sigs = {
        "kvr_kv_pool_create": (I32, [P, U32, U32, P]),
        "kvr_kv_pool_free": (None, [P]),
        "kvr_kv_pool_blocks_total": (U32, [P]),
        "kvr_kv_pool_blocks_free": (U32, [P]),
        "kvr_seq_create_paged": (I32, [P, U32, P]),
        "kvr_seq_blocks": (U32, [P]),
        "kvr_batch_step": (I32, [P, U32, P, P, SZ, P, P, SZ]),
        "kvr_batch_step_sample": (I32, [P, U32, P, P, SZ, P, P, SZ, P, P, P]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


class Pool:
    def __init__(self, model, n_blocks, block_tokens=16):
        self.m, self.lib = model, model.lib
        out = ctypes.c_void_p()
        st = self.lib.kvr_kv_pool_create(model.handle, n_blocks, block_tokens, ctypes.byref(out))
        if st != kvr.OK:
            raise kvr.EngineError(st, self.lib.kvr_last_error().decode(), "kvr_kv_pool_create")
        self.handle = out

    def free_blocks(self):
        return self.lib.kvr_kv_pool_blocks_free(self.handle)

    def total(self):
        return self.lib.kvr_kv_pool_blocks_total(self.handle)

    def seq(self, capacity):
        out = ctypes.c_void_p()
        st = self.lib.kvr_seq_create_paged(self.handle, capacity, ctypes.byref(out))
        if st != kvr.OK:
            raise kvr.EngineError(st, self.lib.kvr_last_error().decode(), "kvr_seq_create_paged")
        s = kvr.Seq.__new__(kvr.Seq)
        s.m, s.lib, s.handle = self.m, self.lib, out
        return s

    def close(self):
        if self.handle:
            self.lib.kvr_kv_pool_free(self.handle)
            self.handle = None


def step(model, items, samplers=None):
    """One kvr_batch_step(_sample): items = [(seq, tokens, want_logits)]; samplers = None or a list
    (None or a sampler per item). Returns (status, [logits row or None], [sampled id or None])."""
    lib, V = model.lib, model.vocab
    n = len(items)
    seqs = (ctypes.c_void_p * n)(*[s.handle.value for s, _, _ in items])
    nt = np.array([len(t) for _, t, _ in items], np.uint32)
    toks = np.ascontiguousarray(np.concatenate([np.asarray(t, np.int32) for _, t, _ in items]))
    want = np.array([1 if w else 0 for _, _, w in items], np.uint32)
    out = np.zeros((max(int(want.sum()), 1), V), np.float32)
    if samplers is None:
        st = lib.kvr_batch_step(seqs, n, nt.ctypes.data, toks.ctypes.data, toks.size, want.ctypes.data,
                                out.ctypes.data, out.size)
        ids = [None] * n
    else:
        smp = (ctypes.c_void_p * n)(*[(s.value if s is not None else None) for s in samplers])
        widths = np.full(n, V, np.uint32)
        got = np.full(n, -2, np.int32)
        st = lib.kvr_batch_step_sample(seqs, n, nt.ctypes.data, toks.ctypes.data, toks.size, want.ctypes.data,
                                       out.ctypes.data, out.size, smp, widths.ctypes.data, got.ctypes.data)
        ids = [int(got[i]) if samplers[i] is not None else None for i in range(n)]
    rows, k = [], 0
    for w in want:
        rows.append(out[k].copy() if w else None)
        k += int(w)
    return st, rows, ids


def ratio(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    d = np.abs(a - ref)
    if not np.all(np.isfinite(d)):
        return float("inf")
    return float(d.max() / max(np.abs(ref).max(), 1e-30))


def check_equivalence(rep, lib, dut_backend, model_dir, kv, rng, steps=8):
    """Random compositions vs each sequence alone; greedy generation in steps vs alone."""
    name = f"{os.path.basename(model_dir)}/{kv}"
    m = kvr.Model(lib, model_dir, kv, dut_backend)
    V = m.vocab
    try:
        n_seq = 6
        plen = [int(x) for x in rng.integers(3, 40, n_seq)]
        dec = 12
        prompts = [rng.integers(0, V, p).astype(np.int32) for p in plen]
        conts = [rng.integers(0, V, dec).astype(np.int32) for _ in range(n_seq)]
        cap = max(plen) + dec + 8
        # alone: every position's logits of prompt + continuation (prefill all, then decodes)
        alone = []
        for p, c in zip(prompts, conts):
            s = m.seq(cap)
            rows = list(s.prefill(p, True))
            for t in c:
                rows.append(s.decode(t))
            alone.append(np.stack(rows))
            s.close()
        pool = Pool(m, n_blocks=n_seq * ((cap + 15) // 16) + 4)
        seqs = [pool.seq(cap) if i % 3 != 2 else m.seq(cap) for i in range(n_seq)]  # paged and contiguous
        start = [int(x) for x in rng.integers(0, 3, n_seq)]  # sequences join at different steps
        full = [np.concatenate([p, c]) for p, c in zip(prompts, conts)]
        done = [0] * n_seq
        worst, rows_checked, step_no = 0.0, 0, 0
        while any(d < len(f) for d, f in zip(done, full)):
            items, who = [], []
            for i in range(n_seq):
                if step_no < start[i] or done[i] >= len(full[i]):
                    continue
                take = 1 if done[i] >= plen[i] else int(rng.integers(1, plen[i] - done[i] + 1))
                want = bool(rng.integers(0, 4)) or done[i] + take >= plen[i]
                items.append((seqs[i], full[i][done[i]:done[i] + take], want))
                who.append((i, done[i] + take - 1))
                done[i] += take
            step_no += 1
            if not items:
                continue
            order = rng.permutation(len(items))
            items, who = [items[k] for k in order], [who[k] for k in order]
            st, rows, _ = step(m, items)
            if st != kvr.OK:
                rep.check("batch", f"{name} batched step", False, f"status {st}: {lib.kvr_last_error().decode()}")
                return
            for (i, pos), row in zip(who, rows):
                if row is None:
                    continue
                worst = max(worst, ratio(row, alone[i][pos]))
                rows_checked += 1
        rep.check("batch", f"{name} batched vs alone ({rows_checked} rows, {step_no} steps, paged + contiguous)",
                  worst < BATCH_BOUND, f"ratio {worst:.2e} (bound {BATCH_BOUND:g})")
        for s in seqs:
            s.close()
        # greedy generation: 6 sequences decoding together vs alone
        gen = 16
        want_tok, got_tok = [], []
        for p in prompts:
            s = m.seq(cap + gen)
            logits = s.prefill(p)[0]
            out = []
            for _ in range(gen):
                t = int(np.argmax(logits))
                out.append(t)
                logits = s.decode(t)
            want_tok.append(out)
            s.close()
        seqs = [pool.seq(cap + gen) if i % 2 else m.seq(cap + gen) for i in range(n_seq)]
        st, rows, _ = step(m, [(s, p, True) for s, p in zip(seqs, prompts)])
        nxt = [int(np.argmax(r)) for r in rows]
        got_tok = [[t] for t in nxt]
        for _ in range(gen - 1):
            st2, rows, _ = step(m, [(s, [t], True) for s, t in zip(seqs, nxt)])
            st = st if st != kvr.OK else st2
            nxt = [int(np.argmax(r)) for r in rows]
            for g, t in zip(got_tok, nxt):
                g.append(t)
        same = sum(a == b for a, b in zip(want_tok, got_tok))
        rep.check("batch", f"{name} greedy {gen} tokens x {n_seq} sequences in batched steps = alone",
                  st == kvr.OK and same == n_seq, f"{same}/{n_seq} identical")
        for s in seqs:
            s.close()
        rep.check("batch", f"{name} pool back to full after freeing", pool.free_blocks() == pool.total(),
                  f"{pool.free_blocks()}/{pool.total()} free")
        pool.close()
    finally:
        m.close()


def check_sampling_in_step(rep, lib, dut_backend, model_dir, rng):
    """kvr_batch_step_sample: each item's id = the same seeded sampler drawing from its alone logits."""
    m = kvr.Model(lib, model_dir, "f32", dut_backend)
    V = m.vocab
    configs = [dict(temperature=0.0), dict(temperature=0.8, top_k=40, seed=11), dict(temperature=1.0, top_k=1, seed=5),
               dict(temperature=0.9, seed=7)]  # the last takes the row route (no top_k)
    try:
        n = len(configs)
        prompts = [rng.integers(0, V, int(k)).astype(np.int32) for k in rng.integers(4, 20, n)]
        pool = Pool(m, n_blocks=n * 4 + 4)
        seqs = [pool.seq(64) for _ in range(n)]
        twins = [m.seq(64) for _ in range(n)]
        sa = [make_sampler(lib, **c) for c in configs]
        sb = [make_sampler(lib, **c) for c in configs]
        try:
            st, _, _ = step(m, [(s, p, False) for s, p in zip(seqs, prompts)])
            for t, p in zip(twins, prompts):
                t.prefill(p)
            same, steps = 0, 10
            ok = st == kvr.OK
            toks = [int(p[-1]) for p in prompts]
            for _ in range(steps):
                st, _, ids = step(m, [(s, [t], False) for s, t in zip(seqs, toks)], samplers=sa)
                ok = ok and st == kvr.OK
                twin_rows = [tw.decode(t) for tw, t in zip(twins, toks)]
                want = [sample_logits(lib, b, r) for b, r in zip(sb, twin_rows)]
                same += sum(a == b for a, b in zip(ids, want))
                toks = want  # both continue from the reference draw
            rep.check("batch", f"{os.path.basename(model_dir)} sampling in the step (greedy, top-k, row route) "
                      "= the sampler on the alone logits", ok and same == steps * n, f"{same}/{steps * n} identical")
        finally:
            for s in sa + sb:
                lib.kvr_sampler_free(s)
            for s in seqs + twins:
                s.close()
            pool.close()
    finally:
        m.close()


def check_pool_exhaustion(rep, lib, dut_backend, model_dir, rng):
    """A step that needs more blocks than are free: KVR_ERR_POOL_EXHAUSTED, nothing changed."""
    m = kvr.Model(lib, model_dir, "f32", dut_backend)
    V = m.vocab
    try:
        pool = Pool(m, n_blocks=6, block_tokens=16)
        a, b = pool.seq(200), pool.seq(200)
        twin = m.seq(200)
        pa = rng.integers(0, V, 40).astype(np.int32)  # 3 blocks
        pb = rng.integers(0, V, 30).astype(np.int32)  # 2 blocks
        st1, _, _ = step(m, [(a, pa, False), (b, pb, False)])
        twin.prefill(pa)
        free0, la, lb = pool.free_blocks(), a.length(), b.length()
        # a decode for a (fits in its last block) plus 40 more tokens for b (3 more blocks; 1 is free)
        more = rng.integers(0, V, 40).astype(np.int32)
        st, _, _ = step(m, [(a, [5], True), (b, more, False)])
        msg = lib.kvr_last_error().decode()
        unchanged = pool.free_blocks() == free0 and a.length() == la and b.length() == lb
        rep.check("batch", "pool exhaustion mid-step is KVR_ERR_POOL_EXHAUSTED and changes nothing",
                  st1 == kvr.OK and st == POOL_EXHAUSTED and unchanged,
                  f"status {st} ({msg[:80]}), free {pool.free_blocks()}/{free0}, lengths {a.length()},{b.length()}")
        # the other sequence is not corrupted: its next logits equal its contiguous twin's, alone
        st2, rows, _ = step(m, [(a, [5], True)])
        r = ratio(rows[0], twin.decode(5)) if st2 == kvr.OK else float("inf")
        rep.check("batch", "after the refused step the running sequence's next logits equal its twin's", r < BATCH_BOUND,
                  f"ratio {r:.2e}")
        for s in (a, b, twin):
            s.close()
        rep.check("batch", "every block back after freeing the pool's sequences", pool.free_blocks() == pool.total(),
                  f"{pool.free_blocks()}/{pool.total()}")
        pool.close()
    finally:
        m.close()


def check_paged_single(rep, lib, dut_backend, model_dir, rng):
    """A paged sequence's single-sequence calls and KV copies vs a contiguous twin."""
    name = f"{os.path.basename(model_dir)}/bf16 paged"
    m = kvr.Model(lib, model_dir, "bf16", dut_backend)
    V, prm = m.vocab, m.params
    samplers = []
    try:
        pool = Pool(m, n_blocks=64, block_tokens=16)
        a, b = pool.seq(200), m.seq(200)
        toks = rng.integers(0, V, 37).astype(np.int32)
        r = ratio(a.prefill(toks, True), b.prefill(toks, True))
        for t in rng.integers(0, V, 6):
            r = max(r, ratio(a.decode(t), b.decode(t)))
        rep.check("batch", f"{name} prefill (every position) + 6 decodes vs contiguous", r < BATCH_BOUND,
                  f"ratio {r:.2e}")
        samplers = [make_sampler(lib, 0.0), make_sampler(lib, 0.0)]
        same = sum(decode_sample(a, int(t), samplers[0]) == decode_sample(b, int(t), samplers[1])
                   for t in rng.integers(0, V, 6))
        rep.check("batch", f"{name} greedy decode_sample = contiguous", same == 6, f"{same}/6 identical")
        # the same KV written into a paged and a contiguous sequence: 70 positions over 5 blocks
        n, L = 70, prm.num_layers
        c, d, e = pool.seq(200), m.seq(200), pool.seq(200)
        kv = []
        for layer in range(L):
            k, v = (kvr.f32_to_bf16_bits(rng.standard_normal((prm.num_kv_heads, n, prm.head_dim)).astype(np.float32))
                    for _ in range(2))
            kv.append((k, v))
            c.kv_write(layer, 0, k, v, "bf16")
            d.kv_write(layer, 0, k, v, "bf16")
        c.set_length(n)
        d.set_length(n)
        exact = all(np.array_equal(c.kv_read(layer, 0, n, "bf16")[w], kv[layer][w]) for layer in range(L)
                    for w in range(2))
        exact = exact and all(np.array_equal(c.kv_read(layer, 13, 40, "bf16")[w], kv[layer][w][:, 13:53])
                              for layer in range(L) for w in range(2))
        rep.check("batch", f"{name} kv_write → kv_read across block boundaries bit for bit", exact, "")
        def same_kv(x, y, dtype):
            return all(np.array_equal(x.kv_read(layer, 0, n, dtype)[w], y.kv_read(layer, 0, n, dtype)[w])
                       for layer in range(L) for w in range(2))

        frames_same, imported = True, True
        for enc in ("bf16", "q8"):
            fa, fb = export_chunk(c, enc, 0, 0, 0, n), export_chunk(d, enc, 0, 0, 0, n)
            frames_same = frames_same and np.array_equal(fa, fb)
            # the paged import must equal the contiguous import of the same frame (bf16: the KV itself)
            f = m.seq(200)
            st_e, st_f = import_chunk_status(e, enc, 0, 0, 0, n, fa), import_chunk_status(f, enc, 0, 0, 0, n, fa)
            imported = imported and st_e == kvr.OK and st_f == kvr.OK and same_kv(e, f, "f32")
            if enc == "bf16":
                imported = imported and same_kv(e, d, "bf16")
            f.close()
        rep.check("batch", f"{name} snapshot chunks (bf16, q8) byte-identical to the contiguous twin's", frames_same,
                  "")
        rep.check("batch", f"{name} snapshot chunks import into a paged sequence as into a contiguous one", imported,
                  "")
        for q in (a, b, c, d, e):
            q.close()
        rep.check("batch", f"{name} every block back", pool.free_blocks() == pool.total(),
                  f"{pool.free_blocks()}/{pool.total()}")
        pool.close()
    finally:
        for q in samplers:
            lib.kvr_sampler_free(q)
        m.close()


def check_paged_projection(rep, lib, dut_backend, rng):
    """kvr_projector_apply_seq with a paged target / a paged source = with contiguous ones, bit for bit
    (300 tokens: more than one 256-token slab and many 16-token blocks)."""
    pdir = os.path.join(MODELS, "projectors", "tiny-fast--tiny-balanced")
    src = kvr.Model(lib, os.path.join(MODELS, "tiny-fast"), "f32", dut_backend)
    dst = kvr.Model(lib, os.path.join(MODELS, "tiny-balanced"), "f32", dut_backend)
    proj = make_projector(lib, src, dst, projector_weights(lib, pdir, src, dst))
    n = 300
    try:
        spool, dpool = Pool(src, 64), Pool(dst, 64)
        s_c, s_p = src.seq(n + 8), spool.seq(n + 8)
        s_c.prefill(rng.integers(0, src.vocab, n).astype(np.int32))
        sp = src.params
        for layer in range(sp.num_layers):  # the same bits in the paged source
            k, v = s_c.kv_read(layer, 0, n, "f32")
            s_p.kv_write(layer, 0, k, v, "f32")
        s_p.set_length(n)
        targets = [dst.seq(n + 8), dpool.seq(n + 8), dst.seq(n + 8)]  # c ← c, p ← c, c ← p
        sts = [lib.kvr_projector_apply_seq(proj, a.handle, t.handle, n, 0)
               for a, t in zip((s_c, s_c, s_p), targets)]
        L = dst.params.num_layers
        same = [all(np.array_equal(t.kv_read(layer, 0, n, "f32")[w], targets[0].kv_read(layer, 0, n, "f32")[w])
                    for layer in range(L) for w in range(2)) for t in targets[1:]]
        rep.check("batch", "projection into a paged target = into a contiguous one, bit for bit",
                  sts[0] == kvr.OK and sts[1] == kvr.OK and same[0], f"status {sts[:2]}")
        rep.check("batch", "projection from a paged source = from a contiguous one, bit for bit",
                  sts[0] == kvr.OK and sts[2] == kvr.OK and same[1], f"status {sts[0]}, {sts[2]}")
        for q in [s_c, s_p] + targets:
            q.close()
        spool.close()
        dpool.close()
    finally:
        lib.kvr_projector_free(proj)
        src.close()
        dst.close()


def section_batch(rep, lib, dut_backend, budget, quick, demos, checkpoints):
    bind(lib)
    t0 = time.time()
    rng = np.random.default_rng(13)
    cases = [(d, kv) for d in demos for kv in ("f32", "bf16")] + [(d, "f32") for d in checkpoints]
    if quick:
        cases = cases[:2] + [c for c in cases[len(demos) * 2:]][:3]
    for d, kv in cases:
        if time.time() - t0 > budget:
            rep.skip("batch", f"{os.path.basename(d)}/{kv}", f"section budget {budget:.0f}s spent")
            continue
        try:
            check_equivalence(rep, lib, dut_backend, d, kv, rng)
        except Exception as e:  # noqa: BLE001
            rep.check("batch", f"{os.path.basename(d)}/{kv} batched vs alone", False, f"raised {type(e).__name__}: {e}")
    for fn in (check_sampling_in_step, check_pool_exhaustion, check_paged_single, check_paged_projection):
        try:
            if fn is check_paged_projection:
                fn(rep, lib, dut_backend, rng)
            else:
                fn(rep, lib, dut_backend, demos[0], rng)
        except Exception as e:  # noqa: BLE001
            rep.check("batch", fn.__name__, False, f"raised {type(e).__name__}: {e}")


SWEEP = (1, 2, 4, 8, 16, 32, 64)


def bench_batch_sweep(rep, lib, backend, model_dir, label, deadline, steps=32, prompt=64, kv="bf16"):
    """Decode tokens/s of batched steps (native greedy sampling) at each batch size, beside the
    single-sequence decode. One row in rep.bench: {"model", "what": "batch decode tok/s", "alone",
    "b1".."b64"}."""
    bind(lib)
    m = kvr.Model(lib, model_dir, kv, backend)
    V = m.vocab
    rng = np.random.default_rng(3)
    row = {"model": label, "what": "batch decode tok/s"}
    try:
        cap = prompt + steps + 8
        s = m.seq(cap)
        s.prefill(rng.integers(0, V, prompt).astype(np.int32))
        s.decode(1)  # warm-up: the second identical decode step captures the CUDA graph
        s.decode(2)
        t1 = time.perf_counter()
        for i in range(steps):
            s.decode(i + 3)
        row["alone"] = steps / (time.perf_counter() - t1)
        s.close()
        pool = Pool(m, n_blocks=max(SWEEP) * ((cap + 15) // 16) + 8)
        for b in SWEEP:
            if time.time() > deadline:
                rep.skip("bench", f"{label} batch {b}", "bench budget spent")
                continue
            seqs = [pool.seq(cap) for _ in range(b)]
            samplers = [make_sampler(lib, 0.0) for _ in range(b)]
            try:
                st, _, ids = step(m, [(q, rng.integers(0, V, prompt).astype(np.int32), False) for q in seqs],
                                  samplers=samplers)
                st, _, ids = step(m, [(q, [1], False) for q in seqs], samplers=samplers)  # warm-up
                t1 = time.perf_counter()
                for _ in range(steps):
                    st, _, ids = step(m, [(q, [max(t, 0)], False) for q, t in zip(seqs, ids)], samplers=samplers)
                    if st != kvr.OK:
                        raise kvr.EngineError(st, lib.kvr_last_error().decode(), "kvr_batch_step_sample")
                row[f"b{b}"] = b * steps / (time.perf_counter() - t1)
            finally:
                for q in samplers:
                    lib.kvr_sampler_free(q)
                for q in seqs:
                    q.close()
        pool.close()
    finally:
        m.close()
    rep.bench.append(row)
    print(f"  bench {label} batch decode tok/s: " + ", ".join(
        f"{k} {v:.0f}" for k, v in row.items() if k not in ("model", "what")), flush=True)
