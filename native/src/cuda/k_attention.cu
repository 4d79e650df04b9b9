// Causal GQA flash attention for prefill and decode (one block body, two kernels: one sequence's
// contiguous cache, or a batched step's pieces each reading its own contiguous or paged cache),
// plus the split-K merge of flash-decoding. f32 online softmax on CUDA cores, K/V read from the cache (the CPU's rounding)
// and widened in shared memory; never a (T×T) score matrix. Plans: common/device_math.h.
// Not tensor-core attention (docs/cuda.md "what is next").
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "kvrelay.h"

namespace kvr::cuda {
namespace {

using dm::kAttnKeyTile;
using dm::kAttnWarps;

// Where a block's keys live: a sequence's cache view (contiguous or paged).
template <int HD, class T>
struct ViewKeys {
  bp::KvView view;
  uint32_t kplane, vplane;
  __device__ __forceinline__ const T* key(uint32_t p) const {
    return static_cast<const T*>(view.base) + bp::kv_elem_index(view, kplane, p, HD);
  }
  __device__ __forceinline__ const T* value(uint32_t p) const {
    return static_cast<const T*>(view.base) + bp::kv_elem_index(view, vplane, p, HD);
  }
};

// The attention of one block: kAttnWarps warps on kv head g, rows [block_row0, +kAttnWarps·RPW)
// of the flattened (token, head-in-group) list of n new tokens at positions pos0.., keys [kb, ke).
// Each warp owns RPW rows; lane j scores key j of each 32-key tile; lane j accumulates dims j,
// j+32, ... of the output. q/out: the first token's row. With splits > 1 the unnormalised result
// goes to partial slot (split·kv_heads + g)·part_rows + slot0 + row.
template <int HD, int RPW, class Kv, class Keys>
__device__ __forceinline__ void attn_block(const float* q, uint32_t ldq, float* out, uint32_t ldo, uint32_t n,
                                           uint32_t pos0, uint32_t group, uint32_t g, uint32_t block_row0,
                                           uint32_t kb, uint32_t ke, const Keys& keys, uint32_t splits, uint32_t split,
                                           float* partial, uint32_t kv_heads, uint32_t part_rows, uint32_t slot0) {
  constexpr int DPL = HD / 32;  // output dims per lane
  constexpr int KLD = HD + dm::kAttnKeyPad;  // K row stride: 16-byte rows, conflict-free float4 reads
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Ks = smem;                               // [kAttnKeyTile][KLD]
  float* Vs = Ks + kAttnKeyTile * KLD;            // [kAttnKeyTile][HD]
  float* Qs = Vs + kAttnKeyTile * HD;             // [kAttnWarps][RPW][HD]

  const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t rows = n * group;
  // Keys the block needs: up to the last row's position (causal), within this split.
  const uint32_t last_row = min(rows, block_row0 + kAttnWarps * RPW) - 1;
  const uint32_t kend = min(ke, pos0 + last_row / group + 1);

  // This warp's rows: query position (or none) and scaled query in shared memory.
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));
  uint32_t qpos[RPW];
  bool valid[RPW];
  float* q_s = Qs + warp * RPW * HD;
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const uint32_t r = block_row0 + warp * RPW + i;
    valid[i] = r < rows;
    const uint32_t t = valid[i] ? r / group : 0, h = g * group + (valid[i] ? r % group : 0);
    qpos[i] = pos0 + t;
    const float* qr = q + static_cast<size_t>(t) * ldq + static_cast<size_t>(h) * HD;
    for (int d = lane; d < HD; d += 32) q_s[i * HD + d] = valid[i] ? qr[d] : 0.f;
  }

  float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DPL; ++c) acc[i][c] = 0.f;
  }

  for (uint32_t tile = kb; tile < kend; tile += kAttnKeyTile) {
    const uint32_t cnt = min(kAttnKeyTile, kend - tile);
    __syncthreads();  // the previous tile is consumed (and q_s written, on the first pass)
    // Warp w loads keys w, w + kAttnWarps, ...: one address computation per key (a paged cache
    // looks its block up once), lanes over the key's dims.
    for (uint32_t j = warp; j < cnt; j += kAttnWarps) {
      const typename Kv::T* kp = keys.key(tile + j);
      const typename Kv::T* vp = keys.value(tile + j);
#pragma unroll
      for (int c = 0; c < DPL; ++c) {
        Ks[j * KLD + lane + 32 * c] = Kv::load(kp + lane + 32 * c);
        Vs[j * HD + lane + 32 * c] = Kv::load(vp + lane + 32 * c);
      }
    }
    __syncthreads();

    // Scores: lane j dots key j with each of the warp's rows, 4 dims per shared-memory read.
    float sd[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) sd[i] = 0.f;
    if (lane < cnt) {
      const float4* kr = reinterpret_cast<const float4*>(Ks + lane * KLD);
      const float4* q4 = reinterpret_cast<const float4*>(q_s);
// Not unrolled: unrolling made ptxas spill a register in some variants (nvcc 13.0).
#pragma unroll 1
      for (int d4 = 0; d4 < HD / 4; ++d4) {
        const float4 kv = kr[d4];
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
          const float4 qv = q4[i * (HD / 4) + d4];
          sd[i] = fmaf(qv.x, kv.x, sd[i]);
          sd[i] = fmaf(qv.y, kv.y, sd[i]);
          sd[i] = fmaf(qv.z, kv.z, sd[i]);
          sd[i] = fmaf(qv.w, kv.w, sd[i]);
        }
      }
    }
    // Online softmax per row: new max, rescale of the running sum and accumulator, p for this tile.
    const uint32_t key = tile + lane;
    float p[RPW];
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const bool ok = valid[i] && lane < cnt && key <= qpos[i];
      const float s = ok ? sd[i] * scale : -INFINITY;
      const float mnew = fmaxf(m[i], warp_max(s));
      p[i] = 0.f;
      if (mnew == -INFINITY) continue;  // warp-uniform: nothing visible to this row yet
      const float corr = m[i] == -INFINITY ? 0.f : expf(m[i] - mnew);
      p[i] = ok ? expf(s - mnew) : 0.f;
      l[i] = l[i] * corr + warp_sum(p[i]);
      m[i] = mnew;
#pragma unroll
      for (int c = 0; c < DPL; ++c) acc[i][c] *= corr;
    }
    // P·V: each V row read once from shared memory for all the warp's rows.
    for (uint32_t j = 0; j < cnt; ++j) {
      float v[DPL];
#pragma unroll
      for (int c = 0; c < DPL; ++c) v[c] = Vs[j * HD + lane + 32 * c];
#pragma unroll
      for (int i = 0; i < RPW; ++i) {
        const float pj = __shfl_sync(0xffffffffu, p[i], j);
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[i][c] = fmaf(pj, v[c], acc[i][c]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    if (!valid[i]) continue;
    const uint32_t r = block_row0 + warp * RPW + i;
    const uint32_t t = r / group, h = g * group + r % group;
    if (splits == 1) {
      const float inv = 1.f / l[i];
      float* o = out + static_cast<size_t>(t) * ldo + static_cast<size_t>(h) * HD;
#pragma unroll
      for (int c = 0; c < DPL; ++c) o[lane + 32 * c] = acc[i][c] * inv;
    } else {
      // partial layout: acc (splits, kv_heads, part_rows, HD), then (m, l) (splits, kv_heads, part_rows, 2)
      const size_t slot = (static_cast<size_t>(split) * kv_heads + g) * part_rows + slot0 + r;
      float* pa = partial + slot * HD;
#pragma unroll
      for (int c = 0; c < DPL; ++c) pa[lane + 32 * c] = acc[i][c];
      if (lane == 0) {
        float* ml = partial + static_cast<size_t>(splits) * kv_heads * part_rows * HD + slot * 2;
        ml[0] = m[i];
        ml[1] = l[i];
      }
    }
  }
}

// A batched step's pieces: block (blockIdx.x → piece and row block, kv head blockIdx.y, split
// blockIdx.z); each piece reads its own sequence's cache.
template <int HD, int RPW, class Kv>
__global__ void __launch_bounds__(kAttnWarps * 32, 1) attn_batch_kernel(BatchAttnArgs a, uint32_t splits) {
  using T = typename Kv::T;
  const uint32_t piece = a.blk_piece[blockIdx.x];
  const bp::SeqDesc& d = a.seqs[a.piece_seq[piece]];
  const uint32_t g = blockIdx.y, split = blockIdx.z;
  const uint32_t group = a.heads / a.kv_heads;
  const uint32_t n = d.n, pos0 = d.pos0, row0 = d.row0;
  uint32_t kb, ke;
  dm::attn_split_range(pos0 + n, splits, split, &kb, &ke);
  const ViewKeys<HD, T> keys{d.kv, bp::kv_plane(a.layer, 0, a.kv_heads, g), bp::kv_plane(a.layer, 1, a.kv_heads, g)};
  attn_block<HD, RPW, Kv>(a.q + static_cast<size_t>(row0) * a.ldq, a.ldq, a.out + static_cast<size_t>(row0) * a.ldo,
                          a.ldo, n, pos0, group, g, a.blk_row0[blockIdx.x], kb, ke, keys, splits, split, a.partial,
                          a.kv_heads, a.total_rows, a.slot0[piece]);
}

// Merges the splits of one (launch row, kv head, dim) with dm::softmax_merge.
__device__ __forceinline__ float merge_splits(const float* partial, uint32_t splits, uint32_t kv_heads,
                                              uint32_t part_rows, uint32_t hd, uint32_t r, uint32_t g, uint32_t d) {
  const float* ml_base = partial + static_cast<size_t>(splits) * kv_heads * part_rows * hd;
  dm::SoftmaxPart run{-INFINITY, 0.f};
  float acc = 0.f;
  for (uint32_t s = 0; s < splits; ++s) {
    const size_t slot = (static_cast<size_t>(s) * kv_heads + g) * part_rows + r;
    const dm::SoftmaxPart ps{ml_base[slot * 2], ml_base[slot * 2 + 1]};
    float mm, wa, wb;
    dm::softmax_merge(run, ps, &mm, &wa, &wb);
    const float pa = wb > 0.f ? partial[slot * hd + d] : 0.f;
    acc = wa * acc + wb * pa;
    run.l = wa * run.l + wb * ps.l;
    run.m = mm;
  }
  return acc / run.l;
}

// The batched launch's merge: one block per (launch row, kv head).
__global__ void attn_batch_merge_kernel(BatchAttnArgs a, uint32_t splits) {
  const uint32_t r = blockIdx.x, g = blockIdx.y, d = threadIdx.x;
  const uint32_t group = a.heads / a.kv_heads, hd = a.head_dim;
  const float o = merge_splits(a.partial, splits, a.kv_heads, a.total_rows, hd, r, g, d);
  const uint32_t piece = a.row_piece[r], lr = a.row_local[r];
  const uint32_t t = a.seqs[a.piece_seq[piece]].row0 + lr / group, h = g * group + lr % group;
  a.out[static_cast<size_t>(t) * a.ldo + static_cast<size_t>(h) * hd + d] = o;
}

template <int HD, int RPW, class Kv>
cudaError_t launch_batch_one(const BatchAttnArgs& a, uint32_t blocks, uint32_t splits, cudaStream_t stream) {
  attn_batch_kernel<HD, RPW, Kv><<<dim3(blocks, a.kv_heads, splits), kAttnWarps * 32, dm::attn_smem_bytes(HD, RPW),
                                   stream>>>(a, splits);
  return cudaGetLastError();
}

template <class Kv>
cudaError_t launch_batch_kv(const BatchAttnArgs& a, uint32_t blocks, uint32_t rpw, uint32_t splits,
                            cudaStream_t stream) {
  const bool four = rpw == 4;
  switch (a.head_dim) {
    case 32: return four ? launch_batch_one<32, 4, Kv>(a, blocks, splits, stream)
                         : launch_batch_one<32, 1, Kv>(a, blocks, splits, stream);
    case 64: return four ? launch_batch_one<64, 4, Kv>(a, blocks, splits, stream)
                         : launch_batch_one<64, 1, Kv>(a, blocks, splits, stream);
    case 128: return four ? launch_batch_one<128, 4, Kv>(a, blocks, splits, stream)
                          : launch_batch_one<128, 1, Kv>(a, blocks, splits, stream);
    case 256: return four ? launch_batch_one<256, 4, Kv>(a, blocks, splits, stream)
                          : launch_batch_one<256, 1, Kv>(a, blocks, splits, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <int HD, class Kv>
cudaError_t raise_smem_limit() {
  const int four = static_cast<int>(dm::attn_smem_bytes(HD, 4)), one = static_cast<int>(dm::attn_smem_bytes(HD, 1));
  const cudaFuncAttribute attr = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t e;
  if ((e = cudaFuncSetAttribute(attn_batch_kernel<HD, 4, Kv>, attr, four)) != cudaSuccess) return e;
  return cudaFuncSetAttribute(attn_batch_kernel<HD, 1, Kv>, attr, one);
}

template <class Kv>
cudaError_t raise_all() {
  cudaError_t e;
  if ((e = raise_smem_limit<32, Kv>()) != cudaSuccess) return e;
  if ((e = raise_smem_limit<64, Kv>()) != cudaSuccess) return e;
  if ((e = raise_smem_limit<128, Kv>()) != cudaSuccess) return e;
  return raise_smem_limit<256, Kv>();
}

}  // namespace

bool attention_supports(uint32_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
}

cudaError_t attention_init() {
  cudaError_t e;
  if ((e = raise_all<KvF32>()) != cudaSuccess) return e;
  if ((e = raise_all<KvBF16>()) != cudaSuccess) return e;
  return raise_all<KvF16>();
}

cudaError_t launch_batch_attention(const BatchAttnArgs& a, uint32_t blocks, uint32_t rows_per_warp, uint32_t splits,
                                   cudaStream_t stream) {
  if (blocks == 0) return cudaSuccess;
  if (splits > 1 && (a.partial == nullptr || a.row_piece == nullptr || a.row_local == nullptr))
    return cudaErrorInvalidValue;
  cudaError_t e;
  switch (a.kv_dtype) {
    case KVR_DTYPE_F32: e = launch_batch_kv<KvF32>(a, blocks, rows_per_warp, splits, stream); break;
    case KVR_DTYPE_BF16: e = launch_batch_kv<KvBF16>(a, blocks, rows_per_warp, splits, stream); break;
    case KVR_DTYPE_F16: e = launch_batch_kv<KvF16>(a, blocks, rows_per_warp, splits, stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess || splits == 1) return e;
  attn_batch_merge_kernel<<<dim3(a.total_rows, a.kv_heads), a.head_dim, 0, stream>>>(a, splits);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
