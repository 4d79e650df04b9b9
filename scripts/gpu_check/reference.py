"""Independent oracles for the GPU check, in numpy: a float64 forward pass of the four supported
families (Llama/Mistral, Qwen2 q/k/v bias, Qwen3 q/k norm; RoPE default/linear/llama3, GQA) that
mirrors HF transformers' math, and a writer of random-weight test checkpoints (config.json +
model.safetensors in F32/F16/BF16). Not the engine: nothing here calls libkvrelay."""

import json
import math
import os
import struct

import numpy as np

from kvr import bf16_bits_to_f32, f32_to_bf16_bits, read_tensor, round_to


def rope_inv_freq(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default")) if rs else "default"
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        low_wl, high_wl = orig / lo, orig / hi
        wl = 2 * math.pi / inv
        out = np.where(wl > low_wl, inv / factor, inv)
        smooth = (orig / wl - lo) / (hi - lo)
        mid = (1 - smooth) * inv / factor + smooth * inv
        out = np.where((wl <= low_wl) & (wl >= high_wl), mid, out)
        inv = out
    return inv


class Reference:
    """float64 forward over a whole token sequence; K/V optionally rounded to the cache dtype
    (the engine stores them rounded and attends over the stored values)."""

    def __init__(self, model_dir, kv_dtype="f32"):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = cfg = json.load(f)
        self.kv_dtype = kv_dtype
        self.arch = cfg["architectures"][0]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.layers = cfg["num_hidden_layers"]
        self.inv_freq = rope_inv_freq(cfg, self.hd)
        t = lambda name: read_tensor(model_dir, name)  # noqa: E731
        self.embed = t("model.embed_tokens.weight")
        self.norm = t("model.norm.weight")
        head = t("lm_head.weight")
        self.lm_head = self.embed if head is None else head
        self.w = []
        for i in range(self.layers):
            p = f"model.layers.{i}."
            names = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                     "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
                     "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias",
                     "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                     "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                     "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"]
            self.w.append({n: t(p + n) for n in names})

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x (T, heads, hd)
        ang = pos[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        h = self.hd // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def forward(self, tokens):
        """Logits (T, vocab) for every position of a fresh sequence."""
        tokens = np.asarray(tokens)
        T = len(tokens)
        pos = np.arange(T, dtype=np.float64)
        x = self.embed[tokens].copy()
        G = self.heads // self.kv_heads
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for L in self.w:
            h = self.rms(x, L["input_layernorm.weight"])
            q = h @ L["self_attn.q_proj.weight"].T
            k = h @ L["self_attn.k_proj.weight"].T
            v = h @ L["self_attn.v_proj.weight"].T
            if L["self_attn.q_proj.bias"] is not None:
                q, k, v = q + L["self_attn.q_proj.bias"], k + L["self_attn.k_proj.bias"], v + L["self_attn.v_proj.bias"]
            q = q.reshape(T, self.heads, self.hd)
            k = k.reshape(T, self.kv_heads, self.hd)
            v = v.reshape(T, self.kv_heads, self.hd)
            if L["self_attn.q_norm.weight"] is not None:
                q, k = self.rms(q, L["self_attn.q_norm.weight"]), self.rms(k, L["self_attn.k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            k, v = round_to(k, self.kv_dtype), round_to(v, self.kv_dtype)
            out = np.empty((T, self.heads, self.hd))
            for hh in range(self.heads):
                g = hh // G
                s = q[:, hh, :] @ k[:, g, :].T / math.sqrt(self.hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g, :]
            o = out.reshape(T, -1) @ L["self_attn.o_proj.weight"].T
            if L["self_attn.o_proj.bias"] is not None:
                o = o + L["self_attn.o_proj.bias"]
            x = x + o
            h = self.rms(x, L["post_attention_layernorm.weight"])
            g = h @ L["mlp.gate_proj.weight"].T
            u = h @ L["mlp.up_proj.weight"].T
            if L["mlp.gate_proj.bias"] is not None:
                g, u = g + L["mlp.gate_proj.bias"], u + L["mlp.up_proj.bias"]
            d = (g / (1 + np.exp(-g)) * u) @ L["mlp.down_proj.weight"].T
            if L["mlp.down_proj.bias"] is not None:
                d = d + L["mlp.down_proj.bias"]
            x = x + d
        return self.rms(x, self.norm) @ self.lm_head.T


# ---- random-weight checkpoints ----

FAMILIES = {
    # name: (architectures, extra config)
    "llama": ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64}}),
    "mistral": ("MistralForCausalLM", {"rope_theta": 1e6}),
    "qwen2": ("Qwen2ForCausalLM", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    "qwen3": ("Qwen3ForCausalLM", {"rope_theta": 1e6}),
}


def write_safetensors(path, tensors, dtype):
    """tensors: {name: float32 array}; stored as dtype "F32" | "F16" | "BF16"."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if dtype == "BF16" and getattr(a, "dtype", None) == np.uint16:
            raw = np.ascontiguousarray(a).tobytes()  # already bf16 bit patterns
            header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
            continue
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "F32":
            raw = a.tobytes()
        elif dtype == "F16":
            raw = a.astype(np.float16).tobytes()
        else:
            raw = f32_to_bf16_bits(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make_config(family, hidden, inter, layers, heads, kv_heads, head_dim, vocab, tie, **extra):
    arch, fam_extra = FAMILIES[family]
    cfg = {"architectures": [arch], "hidden_size": hidden, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "head_dim": head_dim, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": tie, "max_position_embeddings": 32768}
    cfg.update(fam_extra)
    cfg.update(extra)
    return cfg


def random_weights(cfg, seed, scale=None):
    """float32 weights for cfg (std ~ 1/sqrt(fan_in), norms near 1), generated with numpy."""
    rng = np.random.default_rng(seed)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    arch = cfg["architectures"][0]

    def lin(out, inp):
        return (rng.standard_normal((out, inp)) * (scale or 1.0 / math.sqrt(inp))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((V, H)) * 0.5).astype(np.float32),
         "model.norm.weight": norm(H)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = lin(V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = lin(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
        if arch == "Qwen2ForCausalLM":
            for n, d in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
        if arch == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
    return w


def write_checkpoint(out_dir, cfg, dtype, seed, weights=None):
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(cfg, torch_dtype={"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), weights or random_weights(cfg, seed), dtype)
    return out_dir


def test_checkpoints(root):
    """The generated test set: every family, every weight dtype, GQA and head_dim variety."""
    specs = [
        ("llama", "BF16", dict(hidden=128, inter=320, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=512, tie=False)),
        ("llama", "F32", dict(hidden=256, inter=512, layers=2, heads=2, kv_heads=1, head_dim=128, vocab=384, tie=True)),
        ("mistral", "F16", dict(hidden=192, inter=384, layers=2, heads=3, kv_heads=3, head_dim=64, vocab=320, tie=False)),
        ("qwen2", "BF16", dict(hidden=128, inter=256, layers=2, heads=4, kv_heads=1, head_dim=32, vocab=448, tie=True)),
        ("qwen2", "F32", dict(hidden=96, inter=200, layers=2, heads=2, kv_heads=2, head_dim=64, vocab=300, tie=False)),
        ("qwen3", "BF16", dict(hidden=128, inter=384, layers=2, heads=2, kv_heads=1, head_dim=256, vocab=512, tie=True)),
        ("qwen3", "F16", dict(hidden=64, inter=192, layers=3, heads=8, kv_heads=2, head_dim=32, vocab=256, tie=False)),
    ]
    out = []
    for i, (fam, dt, spec) in enumerate(specs):
        d = os.path.join(root, f"{fam}-{dt.lower()}-hd{spec['head_dim']}-g{spec['heads'] // spec['kv_heads']}")
        write_checkpoint(d, make_config(fam, **spec), dt, seed=100 + i)
        out.append(d)
    return out
