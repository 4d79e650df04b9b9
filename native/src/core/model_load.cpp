// kvr_model_load and friends: validates params and the tensor table against the geometry,
// mmaps each safetensors file read-only, hands the validated table to the backend (which packs or
// uploads the weights; backend.h), and unmaps before returning. Every failure is a status +
// message; nothing throws across the ABI. Not the weights layout (cpu/cpu_backend.cpp) nor JSON
// parsing (TypeScript does that).
#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"
#include "core/model.h"
#include "core/probe.h"
#include "host/dtype.h"
#include "host/rope.h"

namespace kvr {
namespace {

constexpr uint32_t kMaxRole = 28;  // per-layer slot table size (roles < 28)

const char* role_name(uint32_t role) {
  switch (role) {
    case KVR_T_EMBED: return "embed_tokens.weight";
    case KVR_T_FINAL_NORM: return "norm.weight";
    case KVR_T_LM_HEAD: return "lm_head.weight";
    case KVR_T_ATTN_NORM: return "input_layernorm.weight";
    case KVR_T_Q: return "q_proj.weight";
    case KVR_T_K: return "k_proj.weight";
    case KVR_T_V: return "v_proj.weight";
    case KVR_T_O: return "o_proj.weight";
    case KVR_T_Q_BIAS: return "q_proj.bias";
    case KVR_T_K_BIAS: return "k_proj.bias";
    case KVR_T_V_BIAS: return "v_proj.bias";
    case KVR_T_O_BIAS: return "o_proj.bias";
    case KVR_T_Q_NORM: return "q_norm.weight";
    case KVR_T_K_NORM: return "k_norm.weight";
    case KVR_T_MLP_NORM: return "post_attention_layernorm.weight";
    case KVR_T_GATE: return "gate_proj.weight";
    case KVR_T_UP: return "up_proj.weight";
    case KVR_T_DOWN: return "down_proj.weight";
    case KVR_T_GATE_BIAS: return "gate_proj.bias";
    case KVR_T_UP_BIAS: return "up_proj.bias";
    case KVR_T_DOWN_BIAS: return "down_proj.bias";
    default: return nullptr;
  }
}

bool is_global_role(uint32_t r) { return r == KVR_T_EMBED || r == KVR_T_FINAL_NORM || r == KVR_T_LM_HEAD; }

// Expected shape for a role; ndim 1 tensors have shape (n, 1).
void expected_shape(const Model& m, uint32_t role, uint32_t* ndim, uint64_t* s0, uint64_t* s1) {
  *ndim = 1;
  *s1 = 1;
  switch (role) {
    case KVR_T_EMBED: case KVR_T_LM_HEAD: *ndim = 2; *s0 = m.vocab; *s1 = m.hidden; break;
    case KVR_T_FINAL_NORM: case KVR_T_ATTN_NORM: case KVR_T_MLP_NORM: case KVR_T_O_BIAS:
    case KVR_T_DOWN_BIAS: *s0 = m.hidden; break;
    case KVR_T_Q: *ndim = 2; *s0 = m.q_dim; *s1 = m.hidden; break;
    case KVR_T_K: case KVR_T_V: *ndim = 2; *s0 = m.kv_dim; *s1 = m.hidden; break;
    case KVR_T_O: *ndim = 2; *s0 = m.hidden; *s1 = m.q_dim; break;
    case KVR_T_Q_BIAS: *s0 = m.q_dim; break;
    case KVR_T_K_BIAS: case KVR_T_V_BIAS: *s0 = m.kv_dim; break;
    case KVR_T_Q_NORM: case KVR_T_K_NORM: *s0 = m.head_dim; break;
    case KVR_T_GATE: case KVR_T_UP: *ndim = 2; *s0 = m.inter; *s1 = m.hidden; break;
    case KVR_T_DOWN: *ndim = 2; *s0 = m.hidden; *s1 = m.inter; break;
    case KVR_T_GATE_BIAS: case KVR_T_UP_BIAS: *s0 = m.inter; break;
    default: *s0 = 0; break;
  }
}

bool finite_pos(float v) { return std::isfinite(v) && v > 0.f; }

int32_t validate_params(const kvr_model_params& p) {
  if (p.arch != KVR_ARCH_LLAMA && p.arch != KVR_ARCH_QWEN2 && p.arch != KVR_ARCH_QWEN3)
    return fail(KVR_ERR_UNSUPPORTED, format("unsupported arch %u (expected 1 llama, 2 qwen2, 3 qwen3)", p.arch));
  const struct { const char* name; uint32_t v; } dims[] = {
      {"vocab_size", p.vocab_size}, {"hidden_size", p.hidden_size},
      {"intermediate_size", p.intermediate_size}, {"num_layers", p.num_layers},
      {"num_heads", p.num_heads}, {"num_kv_heads", p.num_kv_heads}, {"head_dim", p.head_dim}};
  for (const auto& d : dims)
    if (d.v == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("%s must be > 0, got 0", d.name));
  if (p.num_heads % p.num_kv_heads != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("num_heads %u is not a multiple of num_kv_heads %u",
                                                 p.num_heads, p.num_kv_heads));
  if (p.head_dim % 2 != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("head_dim must be even for rotate-half RoPE, got %u", p.head_dim));
  if (p.vocab_size > 0x7fffffffu)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("vocab_size %u exceeds int32 token ids", p.vocab_size));
  if (!finite_pos(p.rms_norm_eps))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("rms_norm_eps must be finite and > 0, got %g", p.rms_norm_eps));
  std::string why;
  if (int32_t st = check_rope(p, &why)) return fail(st, why);
  if (p.tie_word_embeddings > 1 || p.attention_bias > 1 || p.mlp_bias > 1)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("tie_word_embeddings/attention_bias/mlp_bias must be 0 or 1, got %u/%u/%u",
                       p.tie_word_embeddings, p.attention_bias, p.mlp_bias));
  if (!dtype_valid(p.kv_dtype))
    return fail(KVR_ERR_INVALID_ARGUMENT, format("kv_dtype %u is not a kvr_dtype (0 f32, 1 f16, 2 bf16)", p.kv_dtype));
  if (p.n_threads > 4096)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("n_threads %u is out of range (0..4096)", p.n_threads));
  if (int32_t st = check_backend_device(p.backend, p.device)) return st;
  if (p.weights > KVR_WEIGHTS_F32)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("weights %u is not a kvr_weight_format (0 native, 1 q8, 2 q4, 3 f32)", p.weights));
  if (p.weights != KVR_WEIGHTS_NATIVE && p.backend != KVR_BACKEND_CPU)
    return fail(KVR_ERR_UNSUPPORTED,
                format("weights %u (%s) is implemented on the CPU backend only", p.weights,
                       p.weights == KVR_WEIGHTS_Q8 ? "q8" : p.weights == KVR_WEIGHTS_Q4 ? "q4" : "f32"));
  if (p.cpu_kernel > KVR_CPU_KERNEL_AVX512)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("cpu_kernel %u is not a kvr_cpu_kernel (0 auto, 1 generic, 2 avx2, 3 avxvnni, 4 avx512)",
                       p.cpu_kernel));
  if (p.cpu_kernel != KVR_CPU_KERNEL_AUTO && p.backend != KVR_BACKEND_CPU)
    return fail(KVR_ERR_UNSUPPORTED, format("cpu_kernel %u narrows the CPU backend's kernels: the CUDA backend "
                                            "takes 0 (auto) only",
                                            p.cpu_kernel));
  return KVR_OK;
}


struct Mapping {
  std::string path;
  int fd = -1;
  void* addr = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& o) noexcept : path(std::move(o.path)), fd(o.fd), addr(o.addr), size(o.size) {
    o.fd = -1;
    o.addr = nullptr;
  }
  ~Mapping() {
    if (addr) munmap(addr, size);
    if (fd >= 0) close(fd);
  }
};

int32_t map_file(Mapping& m) {
  m.fd = open(m.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m.fd < 0) return fail(KVR_ERR_IO, format("cannot open \"%s\": %s", m.path.c_str(), std::strerror(errno)));
  struct stat st;
  if (fstat(m.fd, &st) != 0)
    return fail(KVR_ERR_IO, format("cannot stat \"%s\": %s", m.path.c_str(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return fail(KVR_ERR_IO, format("\"%s\" is not a regular file", m.path.c_str()));
  m.size = static_cast<size_t>(st.st_size);
  if (m.size == 0) return KVR_OK;  // nothing to map; every tensor row will fail its bounds check
  void* a = mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, m.fd, 0);
  if (a == MAP_FAILED)
    return fail(KVR_ERR_IO, format("cannot mmap \"%s\" (%zu bytes): %s", m.path.c_str(), m.size, std::strerror(errno)));
  m.addr = a;
  madvise(a, m.size, MADV_SEQUENTIAL);
  return KVR_OK;
}

int32_t load_impl(const kvr_model_params* params, const char* paths, size_t paths_len, uint32_t n_paths,
                  const kvr_tensor_desc* tensors, size_t n_tensors, kvr_model** out_model) {
  if (!out_model) return fail(KVR_ERR_INVALID_ARGUMENT, "out_model is NULL");
  *out_model = nullptr;
  if (!params) return fail(KVR_ERR_INVALID_ARGUMENT, "params is NULL");
  if (!paths || paths_len == 0 || n_paths == 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("paths must list >= 1 file (paths_len %zu, n_paths %u)", paths_len, n_paths));
  if (!tensors || n_tensors == 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor table is empty or NULL (n_tensors %zu)", n_tensors));
  const kvr_model_params& p = *params;
  if (int32_t st = validate_params(p)) return st;

  auto model = std::make_shared<Model>();
  Model& m = *model;
  m.params = p;
  m.vocab = p.vocab_size;
  m.hidden = p.hidden_size;
  m.inter = p.intermediate_size;
  m.layers = p.num_layers;
  m.heads = p.num_heads;
  m.kv_heads = p.num_kv_heads;
  m.head_dim = p.head_dim;
  m.q_dim = m.heads * m.head_dim;
  m.kv_dim = m.kv_heads * m.head_dim;
  m.n_threads = p.n_threads ? static_cast<int>(p.n_threads) : omp_get_num_procs();
  if (m.n_threads < 1) m.n_threads = 1;
  m.params.n_threads = static_cast<uint32_t>(m.n_threads);

  // Split the paths buffer.
  std::vector<Mapping> files;
  files.reserve(n_paths);
  size_t pos = 0;
  for (uint32_t i = 0; i < n_paths; ++i) {
    const void* nul = pos < paths_len ? std::memchr(paths + pos, 0, paths_len - pos) : nullptr;
    if (!nul)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("paths buffer (%zu bytes) holds fewer than n_paths %u NUL-terminated paths", paths_len, n_paths));
    const size_t len = static_cast<const char*>(nul) - (paths + pos);
    if (len == 0) return fail(KVR_ERR_INVALID_ARGUMENT, format("path %u is empty", i));
    Mapping mp;
    mp.path.assign(paths + pos, len);
    files.push_back(std::move(mp));
    pos += len + 1;
  }
  if (pos != paths_len)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("paths buffer has %zu trailing bytes after %u paths", paths_len - pos, n_paths));
  for (auto& f : files)
    if (int32_t st = map_file(f)) return st;

  // Validate every row and index it by (role, layer).
  std::vector<long> global(4, -1);
  std::vector<long> slot(m.layers * kMaxRole, -1);
  const bool qwen3 = p.arch == KVR_ARCH_QWEN3;
  for (size_t i = 0; i < n_tensors; ++i) {
    const kvr_tensor_desc& d = tensors[i];
    const char* name = role_name(d.role);
    if (!name) return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor row %zu: unknown role %u", i, d.role));
    const bool glob = is_global_role(d.role);
    if (glob ? d.layer != 0 : d.layer >= m.layers)
      return fail(KVR_ERR_OUT_OF_RANGE, format("tensor row %zu (%s): layer %u out of range (num_layers %zu%s)", i, name,
                                               d.layer, m.layers, glob ? ", global roles use layer 0" : ""));
    if (d.file_index >= n_paths)
      return fail(KVR_ERR_OUT_OF_RANGE, format("tensor row %zu (%s layer %u): file_index %u >= n_paths %u", i, name,
                                               d.layer, d.file_index, n_paths));
    if (!dtype_valid(d.dtype))
      return fail(KVR_ERR_UNSUPPORTED, format("tensor row %zu (%s layer %u): dtype %u is not F32/F16/BF16", i, name,
                                              d.layer, d.dtype));
    if (d.reserved != 0 || d.reserved2 != 0)
      return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor row %zu (%s layer %u): reserved fields must be 0", i, name, d.layer));
    uint32_t endim;
    uint64_t e0, e1;
    expected_shape(m, d.role, &endim, &e0, &e1);
    if (d.ndim != endim || d.shape[0] != e0 || d.shape[1] != e1) {
      return fail(KVR_ERR_CORRUPT,
                  format("tensor row %zu (%s layer %u): shape ndim %u [%llu, %llu], expected ndim %u [%llu, %llu]", i,
                         name, d.layer, d.ndim, (unsigned long long)d.shape[0], (unsigned long long)d.shape[1], endim,
                         (unsigned long long)e0, (unsigned long long)e1));
    }
    const uint64_t elems = e0 * e1;  // geometry bounded by u32 factors: fits u64
    if (elems > (~uint64_t{0}) / 4 || d.nbytes != elems * dtype_size(d.dtype))
      return fail(KVR_ERR_CORRUPT, format("tensor row %zu (%s layer %u): nbytes %llu != %llu elements x %zu bytes (%s)",
                                          i, name, d.layer, (unsigned long long)d.nbytes, (unsigned long long)elems,
                                          dtype_size(d.dtype), dtype_name(d.dtype)));
    const uint64_t fsize = files[d.file_index].size;
    if (d.offset > fsize || d.nbytes > fsize - d.offset)
      return fail(KVR_ERR_CORRUPT, format("tensor row %zu (%s layer %u): offset %llu + nbytes %llu exceeds file \"%s\" of %llu bytes",
                                          i, name, d.layer, (unsigned long long)d.offset, (unsigned long long)d.nbytes,
                                          files[d.file_index].path.c_str(), (unsigned long long)fsize));
    long& s = glob ? global[d.role] : slot[d.layer * kMaxRole + d.role];
    if (s >= 0)
      return fail(KVR_ERR_INVALID_ARGUMENT,
                  format("tensor %s layer %u listed twice (rows %ld and %zu)", name, d.layer, s, i));
    s = static_cast<long>(i);
  }

  // Presence rules.
  if (global[KVR_T_EMBED] < 0) return fail(KVR_ERR_CORRUPT, "missing tensor embed_tokens.weight");
  if (global[KVR_T_FINAL_NORM] < 0) return fail(KVR_ERR_CORRUPT, "missing tensor norm.weight");
  if (p.tie_word_embeddings && global[KVR_T_LM_HEAD] >= 0)
    return fail(KVR_ERR_INVALID_ARGUMENT, "lm_head.weight listed but tie_word_embeddings=1 (omit it when tied)");
  if (!p.tie_word_embeddings && global[KVR_T_LM_HEAD] < 0)
    return fail(KVR_ERR_CORRUPT, "missing tensor lm_head.weight (tie_word_embeddings=0)");
  const uint32_t required[] = {KVR_T_ATTN_NORM, KVR_T_Q, KVR_T_K, KVR_T_V, KVR_T_O,
                               KVR_T_MLP_NORM, KVR_T_GATE, KVR_T_UP, KVR_T_DOWN};
  for (size_t l = 0; l < m.layers; ++l) {
    const long* s = &slot[l * kMaxRole];
    for (uint32_t r : required)
      if (s[r] < 0) return fail(KVR_ERR_CORRUPT, format("missing tensor %s for layer %zu", role_name(r), l));
    for (uint32_t r : {KVR_T_Q_NORM, KVR_T_K_NORM}) {
      if (qwen3 && s[r] < 0) return fail(KVR_ERR_CORRUPT, format("missing tensor %s for layer %zu (Qwen3)", role_name(r), l));
      if (!qwen3 && s[r] >= 0)
        return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor %s listed for layer %zu but arch %u is not Qwen3", role_name(r), l, p.arch));
    }
    for (uint32_t r : {KVR_T_Q_BIAS, KVR_T_K_BIAS, KVR_T_V_BIAS, KVR_T_O_BIAS}) {
      if (!p.attention_bias && s[r] >= 0)
        return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor %s listed for layer %zu but attention_bias=0", role_name(r), l));
      if (p.attention_bias && r != KVR_T_O_BIAS && s[r] < 0)
        return fail(KVR_ERR_CORRUPT, format("missing tensor %s for layer %zu (attention_bias=1)", role_name(r), l));
      if (r == KVR_T_O_BIAS && l > 0 && (s[r] >= 0) != (slot[KVR_T_O_BIAS] >= 0))
        return fail(KVR_ERR_CORRUPT, format("o_proj.bias is listed for some layers but not layer %zu", l));
    }
    for (uint32_t r : {KVR_T_GATE_BIAS, KVR_T_UP_BIAS, KVR_T_DOWN_BIAS}) {
      if (!p.mlp_bias && s[r] >= 0)
        return fail(KVR_ERR_INVALID_ARGUMENT, format("tensor %s listed for layer %zu but mlp_bias=0", role_name(r), l));
      if (p.mlp_bias && s[r] < 0)
        return fail(KVR_ERR_CORRUPT, format("missing tensor %s for layer %zu (mlp_bias=1)", role_name(r), l));
    }
  }

  // Hand the validated table (host pointers into the mappings) to the backend, which packs or
  // uploads the weights; the mappings stay valid until it returns.
  TensorTable table(m.layers);
  for (size_t i = 0; i < n_tensors; ++i) {
    const kvr_tensor_desc& d = tensors[i];
    TensorView v;
    v.role = d.role;
    v.layer = d.layer;
    v.dtype = d.dtype;
    v.rows = d.shape[0];
    v.cols = d.shape[1];
    v.nbytes = d.nbytes;
    v.data = static_cast<const uint8_t*>(files[d.file_index].addr) + d.offset;
    table.add(v);
  }
  m.inv_freq = rope_inv_freq(p);
  // The recipe from the params, and the one choice the table makes: an o_proj bias is optional
  // under attention_bias, all layers or none (checked above).
  m.layer_plan.qk_norm = p.arch == KVR_ARCH_QWEN3;
  m.layer_plan.qkv_bias = p.attention_bias != 0;
  m.layer_plan.o_bias = p.attention_bias != 0 && table.find(KVR_T_O_BIAS, 0) != nullptr;
  m.layer_plan.mlp_bias = p.mlp_bias != 0;
  m.layer_plan.tied_embeddings = p.tie_word_embeddings != 0;
  if (p.backend == KVR_BACKEND_CUDA) m.backend = make_cuda_backend(m, table, static_cast<int32_t>(p.device));
  else m.backend = make_cpu_backend(m, table);
  files.clear();  // unmap before returning

  kvr_model* out = new kvr_model;
  out->m = std::move(model);
  *out_model = out;
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

extern "C" {

KVR_API void kvr_model_default_params(kvr_model_params* params) {
  if (!params) return;
  std::memset(params, 0, sizeof(*params));
  params->rms_norm_eps = 1e-6f;
  params->rope_theta = 10000.f;
  params->rope_factor = 1.f;
  params->kv_dtype = KVR_DTYPE_F32;
  params->n_threads = 0;
  params->backend = KVR_BACKEND_CPU;
  params->device = 0;
  params->weights = KVR_WEIGHTS_NATIVE;
  params->cpu_kernel = KVR_CPU_KERNEL_AUTO;
}

KVR_API int32_t kvr_model_load(const kvr_model_params* params, const char* paths, size_t paths_len,
                               uint32_t n_paths, const kvr_tensor_desc* tensors, size_t n_tensors,
                               kvr_model** out_model) {
  try {
    return kvr::load_impl(params, paths, paths_len, n_paths, tensors, n_tensors, out_model);
  } catch (const kvr::BackendError& e) {
    return kvr::fail(e.status, e.message);
  } catch (const std::bad_alloc&) {
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "out of memory while loading the model weights");
  } catch (const std::exception& e) {
    return kvr::fail(KVR_ERR_INTERNAL, kvr::format("internal error while loading: %s", e.what()));
  } catch (...) {
    return kvr::fail(KVR_ERR_INTERNAL, "internal error while loading (unknown exception)");
  }
}

KVR_API void kvr_model_free(kvr_model* model) { delete model; }

KVR_API uint32_t kvr_model_threads(const kvr_model* model) {
  return model ? static_cast<uint32_t>(model->m->n_threads) : 0;
}

KVR_API int32_t kvr_model_backend(const kvr_model* model, uint32_t* out_backend, uint32_t* out_device, char* info,
                                  size_t info_len) {
  if (!model) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  if (!info && info_len > 0) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "info is NULL but info_len > 0");
  const kvr::Model& m = *model->m;
  if (out_backend) *out_backend = m.backend->kind();
  if (out_device) *out_device = m.params.device;
  try {
    kvr::copy_info(m.backend->device_description(), info, info_len);
  } catch (...) {
    kvr::copy_info("", info, info_len);
  }
  return KVR_OK;
}

KVR_API int32_t kvr_model_health(const kvr_model* model, char* info, size_t info_len) {
  if (!model) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  if (!info && info_len > 0) return kvr::fail(KVR_ERR_INVALID_ARGUMENT, "info is NULL but info_len > 0");
  try {
    const std::string why = model->m->backend->failure();
    kvr::copy_info(why, info, info_len);
    return why.empty() ? KVR_OK : kvr::fail(KVR_ERR_INTERNAL, why);
  } catch (...) {
    kvr::copy_info("out of memory", info, info_len);
    return kvr::fail(KVR_ERR_OUT_OF_MEMORY, "out of memory in kvr_model_health");
  }
}

KVR_API uint64_t kvr_model_weight_bytes(const kvr_model* model) {
  return model ? model->m->backend->weight_bytes() : 0;
}

}  // extern "C"
