"""ctypes mirror of the libkvrelay C ABI (native/include/kvrelay.h, ABI 3) and a small HF checkpoint
reader (config.json + safetensors headers → kvr_model_params + tensor table), mirroring lib/model
and lib/native for the GPU check. Not a general binding: only what scripts/gpu_check needs."""

import ctypes
import json
import os
import struct

import numpy as np

ABI_VERSION = 4
OK = 0
STATUS_NAMES = {
    0: "OK", -1: "INVALID_ARGUMENT", -2: "OUT_OF_RANGE", -3: "CAPACITY", -4: "IO",
    -5: "UNSUPPORTED", -6: "OUT_OF_MEMORY", -7: "CORRUPT", -8: "INTERNAL",
    -9: "CHECKSUM", -10: "POOL_EXHAUSTED",
}
DTYPE = {"f32": 0, "f16": 1, "bf16": 2}
DTYPE_SIZE = {0: 4, 1: 2, 2: 2}
ST_DTYPE = {"F32": 0, "F16": 1, "BF16": 2}
BACKEND = {"cpu": 0, "cuda": 1}
# kvr_model_set_debug flags (kvrelay_test.h, the test library); DEBUG_FLAGS applies to every model a process
# loads (gpu_check.py --sync-launches sets it in its sections' processes).
DEBUG_FALLBACK_GEMM, DEBUG_SYNC_LAUNCHES = 1, 2
DEBUG_FLAGS = 0
ARCH = {"LlamaForCausalLM": 1, "MistralForCausalLM": 1, "Qwen2ForCausalLM": 2, "Qwen3ForCausalLM": 3}
ROPE = {"none": 0, "linear": 1, "llama3": 2}

GLOBAL_ROLES = {"model.embed_tokens.weight": 1, "model.norm.weight": 2, "lm_head.weight": 3}
LAYER_ROLES = {
    "input_layernorm.weight": 10, "self_attn.q_proj.weight": 11, "self_attn.k_proj.weight": 12,
    "self_attn.v_proj.weight": 13, "self_attn.o_proj.weight": 14, "self_attn.q_proj.bias": 15,
    "self_attn.k_proj.bias": 16, "self_attn.v_proj.bias": 17, "self_attn.o_proj.bias": 18,
    "self_attn.q_norm.weight": 19, "self_attn.k_norm.weight": 20,
    "post_attention_layernorm.weight": 21, "mlp.gate_proj.weight": 22, "mlp.up_proj.weight": 23,
    "mlp.down_proj.weight": 24, "mlp.gate_proj.bias": 25, "mlp.up_proj.bias": 26,
    "mlp.down_proj.bias": 27,
}


class Params(ctypes.Structure):
    """kvr_model_params: 96 bytes, all fields 4-byte (kvrelay.h documents the offsets)."""
    _fields_ = [(n, ctypes.c_uint32) for n in (
        "arch", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
        "num_kv_heads", "head_dim")] + [("rms_norm_eps", ctypes.c_float), ("rope_theta", ctypes.c_float),
                                        ("rope_scaling", ctypes.c_uint32), ("rope_factor", ctypes.c_float),
                                        ("rope_low_freq_factor", ctypes.c_float),
                                        ("rope_high_freq_factor", ctypes.c_float)] + [
        (n, ctypes.c_uint32) for n in ("rope_original_max_position", "tie_word_embeddings",
                                       "attention_bias", "mlp_bias", "kv_dtype", "n_threads",
                                       "backend", "device", "weights", "cpu_kernel")]


class TensorDesc(ctypes.Structure):
    """kvr_tensor_desc: 64 bytes."""
    _fields_ = [("role", ctypes.c_uint32), ("layer", ctypes.c_uint32), ("file_index", ctypes.c_uint32),
                ("dtype", ctypes.c_uint32), ("ndim", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("shape", ctypes.c_uint64 * 2), ("offset", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("reserved2", ctypes.c_uint64)]


assert ctypes.sizeof(Params) == 96 and ctypes.sizeof(TensorDesc) == 64


class EngineError(RuntimeError):
    def __init__(self, status, message, what):
        super().__init__(f"{what} failed ({STATUS_NAMES.get(status, status)}, {status}): {message}")
        self.status = status


def open_library(path):
    # The test library beside it (the same objects plus kvrelay_test.h: kvr_model_set_debug) when
    # there is one: the check drives the whole engine through it.
    test_lib = os.path.join(os.path.dirname(os.path.abspath(path)), "libkvrelay_test.so")
    if os.path.basename(path) == "libkvrelay.so" and os.path.exists(test_lib):
        path = test_lib
    lib = ctypes.CDLL(os.path.abspath(path))
    P, U32, I32, SZ = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
    sigs = {
        "kvr_abi_version": (U32, []),
        "kvr_last_error": (ctypes.c_char_p, []),
        "kvr_model_default_params": (None, [P]),
        "kvr_backend_probe": (I32, [U32, I32, ctypes.c_char_p, SZ]),
        "kvr_model_load": (I32, [P, ctypes.c_char_p, SZ, U32, P, SZ, P]),
        "kvr_model_free": (None, [P]),
        "kvr_model_weight_bytes": (ctypes.c_uint64, [P]),
        "kvr_model_backend": (I32, [P, P, P, ctypes.c_char_p, SZ]),
        "kvr_model_health": (I32, [P, ctypes.c_char_p, SZ]),
        "kvr_seq_create": (I32, [P, U32, P]),
        "kvr_seq_free": (None, [P]),
        "kvr_seq_length": (U32, [P]),
        "kvr_seq_last_error": (ctypes.c_char_p, [P]),
        "kvr_seq_prefill": (I32, [P, P, SZ, U32, P, SZ]),
        "kvr_seq_decode": (I32, [P, I32, P, SZ]),
        "kvr_seq_kv_read": (I32, [P, U32, U32, U32, U32, P, SZ, P, SZ]),
        "kvr_seq_kv_write": (I32, [P, U32, U32, U32, U32, P, SZ, P, SZ]),
        "kvr_seq_set_length": (I32, [P, U32]),
        "kvr_model_set_debug": (I32, [P, U32]),
    }
    for name, (res, args) in sigs.items():
        if name == "kvr_model_set_debug" and not hasattr(lib, name):
            continue  # the production library alone: no debug switches
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    got = lib.kvr_abi_version()
    if got != ABI_VERSION:
        raise RuntimeError(f"{path}: ABI version {got}, this driver speaks {ABI_VERSION}")
    return lib


def probe(lib, backend, device=0):
    buf = ctypes.create_string_buffer(512)
    st = lib.kvr_backend_probe(BACKEND[backend], device, buf, len(buf))
    return st, buf.value.decode()


# ---- checkpoints ----

def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def checkpoint_files(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, n) for n in names]
    return [os.path.join(model_dir, "model.safetensors")]


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def model_params(lib, cfg, kv_dtype="f32", backend="cpu", device=0, n_threads=0):
    p = Params()
    lib.kvr_model_default_params(ctypes.byref(p))
    arch = ARCH[cfg["architectures"][0]]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or (128 if arch == 3 and "head_dim" not in cfg else cfg["hidden_size"] // heads)
    p.arch = arch
    p.vocab_size = cfg["vocab_size"]
    p.hidden_size = cfg["hidden_size"]
    p.intermediate_size = cfg["intermediate_size"]
    p.num_layers = cfg["num_hidden_layers"]
    p.num_heads = heads
    p.num_kv_heads = cfg.get("num_key_value_heads") or heads
    p.head_dim = head_dim
    p.rms_norm_eps = cfg.get("rms_norm_eps", 1e-6)
    p.rope_theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default")) if rs else "default"
    if kind == "linear":
        p.rope_scaling, p.rope_factor = ROPE["linear"], rs["factor"]
    elif kind == "llama3":
        p.rope_scaling, p.rope_factor = ROPE["llama3"], rs["factor"]
        p.rope_low_freq_factor, p.rope_high_freq_factor = rs["low_freq_factor"], rs["high_freq_factor"]
        p.rope_original_max_position = rs["original_max_position_embeddings"]
    p.tie_word_embeddings = 1 if cfg.get("tie_word_embeddings", False) else 0
    p.attention_bias = 1 if (arch == 2 or cfg.get("attention_bias", False)) else 0
    p.mlp_bias = 1 if cfg.get("mlp_bias", False) else 0
    p.kv_dtype = DTYPE[kv_dtype]
    p.n_threads = n_threads
    p.backend = BACKEND[backend]
    p.device = device
    return p


def tensor_table(model_dir):
    files = checkpoint_files(model_dir)
    rows = []
    for fi, path in enumerate(files):
        header, base = read_header(path)
        for name, t in header.items():
            role, layer = GLOBAL_ROLES.get(name), 0
            if role is None:
                parts = name.split(".")
                if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
                    layer = int(parts[2])
                    role = LAYER_ROLES.get(".".join(parts[3:]))
            if role is None:
                continue  # e.g. rotary inv_freq buffers
            d = TensorDesc()
            d.role, d.layer, d.file_index, d.dtype = role, layer, fi, ST_DTYPE[t["dtype"]]
            shape = t["shape"]
            d.ndim = len(shape)
            d.shape[0] = shape[0]
            d.shape[1] = shape[1] if len(shape) > 1 else 1
            d.offset = base + t["data_offsets"][0]
            d.nbytes = t["data_offsets"][1] - t["data_offsets"][0]
            rows.append(d)
    return files, rows


def read_tensor_raw(model_dir, name):
    """A checkpoint tensor as stored: (safetensors dtype, numpy array of f32 / f16 / uint16 bf16
    bits, shaped), or None."""
    for path in checkpoint_files(model_dir):
        header, base = read_header(path)
        if name in header:
            t = header[name]
            a, b = t["data_offsets"]
            raw = np.fromfile(path, dtype=np.uint8, count=b - a, offset=base + a)
            view = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t["dtype"]]
            return t["dtype"], raw.view(view).reshape(t["shape"])
    return None


def read_tensor(model_dir, name):
    """A checkpoint tensor as float64 (bf16/f16 widened exactly)."""
    for path in checkpoint_files(model_dir):
        header, base = read_header(path)
        if name in header:
            t = header[name]
            a, b = t["data_offsets"]
            raw = np.fromfile(path, dtype=np.uint8, count=b - a, offset=base + a)
            if t["dtype"] == "F32":
                v = raw.view(np.float32)
            elif t["dtype"] == "F16":
                v = raw.view(np.float16)
            else:
                v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return v.astype(np.float64).reshape(t["shape"])
    return None


# ---- bf16 in numpy (no native dtype) ----

def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """Rounds an array to a KV dtype (nearest even) and back to float64."""
    x32 = np.asarray(x, dtype=np.float32)
    if dtype == "f32":
        return x32.astype(np.float64)
    if dtype == "f16":
        return x32.astype(np.float16).astype(np.float64)
    return bf16_bits_to_f32(f32_to_bf16_bits(x32)).astype(np.float64)


# ---- model and sequence wrappers ----

class Model:
    def __init__(self, lib, model_dir, kv_dtype="f32", backend="cpu", device=0, n_threads=0, debug=0):
        """debug: KVR_DEBUG_* flags for this model, OR-ed with DEBUG_FLAGS."""
        self.lib, self.dir, self.kv_dtype = lib, model_dir, kv_dtype
        self.cfg = load_config(model_dir)
        self.params = model_params(lib, self.cfg, kv_dtype, backend, device, n_threads)
        files, rows = tensor_table(model_dir)
        blob = b"".join(os.fsencode(f) + b"\0" for f in files)
        table = (TensorDesc * len(rows))(*rows)
        out = ctypes.c_void_p()
        st = lib.kvr_model_load(ctypes.byref(self.params), blob, len(blob), len(files), table, len(rows),
                                ctypes.byref(out))
        if st != OK:
            raise EngineError(st, lib.kvr_last_error().decode(), "kvr_model_load")
        self.handle = out
        flags = debug | DEBUG_FLAGS
        if flags:
            st = lib.kvr_model_set_debug(out, flags)
            if st != OK:
                self.close()
                raise EngineError(st, lib.kvr_last_error().decode(), "kvr_model_set_debug")
        self.vocab = self.params.vocab_size
        info = ctypes.create_string_buffer(512)
        b, d = ctypes.c_uint32(), ctypes.c_uint32()
        lib.kvr_model_backend(out, ctypes.byref(b), ctypes.byref(d), info, len(info))
        self.backend, self.device_info = b.value, info.value.decode()

    def close(self):
        if self.handle:
            self.lib.kvr_model_free(self.handle)
            self.handle = None

    def seq(self, capacity):
        return Seq(self, capacity)


class Seq:
    def __init__(self, model, capacity):
        self.m, self.lib = model, model.lib
        out = ctypes.c_void_p()
        st = self.lib.kvr_seq_create(model.handle, capacity, ctypes.byref(out))
        if st != OK:
            raise EngineError(st, self.lib.kvr_last_error().decode(), "kvr_seq_create")
        self.handle = out

    def _check(self, st, what):
        if st != OK:
            raise EngineError(st, self.lib.kvr_seq_last_error(self.handle).decode(), what)

    def close(self):
        if self.handle:
            self.lib.kvr_seq_free(self.handle)
            self.handle = None

    def prefill(self, tokens, all_positions=False):
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        rows = len(toks) if all_positions else 1
        out = np.empty((rows, self.m.vocab), dtype=np.float32)
        st = self.lib.kvr_seq_prefill(self.handle, toks.ctypes.data, len(toks), 1 if all_positions else 0,
                                      out.ctypes.data, out.size)
        self._check(st, "kvr_seq_prefill")
        return out

    def decode(self, token):
        out = np.empty(self.m.vocab, dtype=np.float32)
        self._check(self.lib.kvr_seq_decode(self.handle, int(token), out.ctypes.data, out.size), "kvr_seq_decode")
        return out

    def length(self):
        return self.lib.kvr_seq_length(self.handle)

    def kv_read(self, layer, start, count, dtype):
        p = self.m.params
        shape = (p.num_kv_heads, count, p.head_dim)
        np_dtype = np.float32 if dtype == "f32" else np.uint16
        k, v = np.empty(shape, np_dtype), np.empty(shape, np_dtype)
        st = self.lib.kvr_seq_kv_read(self.handle, layer, start, count, DTYPE[dtype], k.ctypes.data, k.nbytes,
                                      v.ctypes.data, v.nbytes)
        self._check(st, "kvr_seq_kv_read")
        return k, v

    def kv_write(self, layer, start, k, v, dtype):
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
        st = self.lib.kvr_seq_kv_write(self.handle, layer, start, k.shape[1], DTYPE[dtype], k.ctypes.data, k.nbytes,
                                       v.ctypes.data, v.nbytes)
        self._check(st, "kvr_seq_kv_write")

    def set_length(self, n):
        self._check(self.lib.kvr_seq_set_length(self.handle, n), "kvr_seq_set_length")
