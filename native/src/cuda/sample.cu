// The device part of a sampling decode step (docs/gpu-handoff.md §4): the greedy token and the
// `top` largest logits of one row by (value descending, id ascending), NaN as -inf and -inf never
// selected — the candidate order of common/sample_math.h, which the CPU sampler sorts by too. A
// top-k draw depends only on those entries (sampling.cpp sample_candidates), so the host draws
// from ≤ 64 candidates instead of copying the row. Tiling constants: sample_math.h.
// Two passes: each block selects its segment's top entries, one block merges them.
// Compiled, not run (no GPU was lent while it was written).
#include <cstdint>

#include "common/sample_math.h"
#include "cuda/handoff.h"

namespace kvr::cuda {
namespace {

constexpr int kThreads = sm::kSelectThreads, kItems = sm::kSelectItems, kSegment = sm::kSelectSegment,
              kMaxTop = sm::kMaxCandidates;
constexpr float kNegInf = -__builtin_huge_valf();

struct Cand {
  float v;
  int32_t id;
};

__device__ __forceinline__ bool better(Cand a, Cand b) {
  return a.id >= 0 && (b.id < 0 || sm::before(a.v, a.id, b.v, b.id));
}

__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Cand d{__shfl_xor_sync(0xffffffffu, c.v, o), __shfl_xor_sync(0xffffffffu, c.id, o)};
    if (better(d, c)) c = d;
  }
  return c;
}

// Selects the best `top` of n candidates (vals[i], ids ? ids[i] : base + i), writing `top` slots
// (unused ones (-inf, -1)) at out_v / out_id and the number selected to *out_count (if non-null).
__device__ void select_top(const float* vals, const int32_t* ids, uint32_t base, uint32_t n, uint32_t top,
                           float* out_v, int32_t* out_id, uint32_t* out_count) {
  __shared__ Cand warp_winner[kThreads / 32];
  __shared__ Cand winner;
  float v[kItems];
  int32_t id[kItems];
#pragma unroll
  for (int q = 0; q < kItems; ++q) {
    const uint32_t i = threadIdx.x + q * kThreads;
    float x = i < n ? vals[i] : kNegInf;
    if (x != x) x = kNegInf;  // NaN counts as -inf
    v[q] = x;
    id[q] = i < n ? (ids ? ids[i] : static_cast<int32_t>(base + i)) : -1;
    if (!sm::selectable(v[q])) id[q] = -1;  // never selected
  }
  uint32_t count = 0;
  for (uint32_t round = 0; round < top; ++round) {
    Cand mine{kNegInf, -1};
#pragma unroll
    for (int q = 0; q < kItems; ++q) {
      const Cand c{v[q], id[q]};
      if (c.id >= 0 && better(c, mine)) mine = c;
    }
    const Cand w = warp_best(mine);
    if (threadIdx.x % 32 == 0) warp_winner[threadIdx.x / 32] = w;
    __syncthreads();
    if (threadIdx.x < 32) {
      const Cand b = warp_best(warp_winner[threadIdx.x]);
      if (threadIdx.x == 0) winner = b;
    }
    __syncthreads();
    const Cand b = winner;
    if (b.id < 0) {  // nothing left
      if (threadIdx.x == 0)
        for (uint32_t r = round; r < top; ++r) out_v[r] = kNegInf, out_id[r] = -1;
      break;
    }
#pragma unroll
    for (int q = 0; q < kItems; ++q)
      if (id[q] == b.id) id[q] = -1;  // ids are unique: the winner leaves
    if (threadIdx.x == 0) out_v[round] = b.v, out_id[round] = b.id;
    ++count;
    __syncthreads();  // winner is rewritten next round
  }
  if (out_count != nullptr && threadIdx.x == 0) *out_count = count;
}

__global__ void select_segments(const float* logits, uint32_t width, uint32_t top, float* seg_v, int32_t* seg_id) {
  const uint32_t base = blockIdx.x * kSegment;
  const uint32_t n = width - base < kSegment ? width - base : kSegment;
  select_top(logits + base, nullptr, base, n, top, seg_v + blockIdx.x * top, seg_id + blockIdx.x * top, nullptr);
}

__global__ void select_final(const float* seg_v, const int32_t* seg_id, uint32_t n, uint32_t top, int32_t* token,
                             int32_t* top_ids, float* top_logits, uint32_t* top_count) {
  __shared__ float out_v[kMaxTop];
  __shared__ int32_t out_id[kMaxTop];
  __shared__ uint32_t count;
  select_top(seg_v, seg_id, 0, n, top, out_v, out_id, &count);
  __syncthreads();
  if (threadIdx.x < top) {
    if (top_ids) top_ids[threadIdx.x] = out_id[threadIdx.x];
    if (top_logits) top_logits[threadIdx.x] = out_v[threadIdx.x];
  }
  if (threadIdx.x == 0) {
    *token = out_id[0];
    if (top_count) *top_count = count;
  }
}

}  // namespace

size_t sample_scratch_bytes(uint32_t width) {
  const size_t segments = sm::select_segments(width);
  return segments * kMaxTop * (sizeof(float) + sizeof(int32_t));
}

cudaError_t launch_sample_reduce(const float* logits, uint32_t width, uint32_t top, int32_t* d_token,
                                 int32_t* d_top_ids, float* d_top_logits, uint32_t* d_top_count, void* d_scratch,
                                 cudaStream_t stream) {
  const uint32_t k = top == 0 ? 1 : top;  // greedy needs the best one
  const uint32_t segments = sm::select_segments(width);
  if (!sm::select_fits(width, k)) return cudaErrorInvalidValue;
  float* seg_v = static_cast<float*>(d_scratch);
  int32_t* seg_id = reinterpret_cast<int32_t*>(seg_v + static_cast<size_t>(segments) * kMaxTop);
  select_segments<<<segments, kThreads, 0, stream>>>(logits, width, k, seg_v, seg_id);
  select_final<<<1, kThreads, 0, stream>>>(seg_v, seg_id, segments * k, k, d_token, top ? d_top_ids : nullptr,
                                           top ? d_top_logits : nullptr, top ? d_top_count : nullptr);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
