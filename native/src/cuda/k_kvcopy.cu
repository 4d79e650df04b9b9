// Copies KV positions between two cache views (bp::KvView: contiguous or paged), every layer, K
// and V, kv head: how a paged sequence's snapshot chunks go through the device codec, which
// addresses one contiguous cache (cuda_backend.cpp export_chunk / import_chunk). Bytes are moved
// as they are (same dtype on both sides). Launcher declared in kernels.h. Compiled, not run.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace kvr::cuda {
namespace {

// Block (position p, plane): one head's row of head_dim elements, moved in 4-byte words.
__global__ void kv_copy_kernel(bp::KvView src, uint32_t src_pos0, bp::KvView dst, uint32_t dst_pos0,
                               uint32_t head_dim, uint32_t elem_bytes) {
  const uint32_t p = blockIdx.x, plane = blockIdx.y;
  const uint8_t* s = static_cast<const uint8_t*>(src.base) +
                     bp::kv_elem_index(src, plane, src_pos0 + p, head_dim) * elem_bytes;
  uint8_t* d = static_cast<uint8_t*>(dst.base) + bp::kv_elem_index(dst, plane, dst_pos0 + p, head_dim) * elem_bytes;
  const uint32_t words = head_dim * elem_bytes / 4;
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x)
    reinterpret_cast<uint32_t*>(d)[i] = reinterpret_cast<const uint32_t*>(s)[i];
}

}  // namespace

cudaError_t launch_kv_copy(const bp::KvView& src, uint32_t src_pos0, const bp::KvView& dst, uint32_t dst_pos0,
                           uint32_t count, uint32_t planes, uint32_t head_dim, uint32_t elem_bytes,
                           cudaStream_t stream) {
  if (count == 0 || planes == 0) return cudaSuccess;
  if ((head_dim * elem_bytes) % 4 != 0 || planes > 65535) return cudaErrorInvalidValue;
  kv_copy_kernel<<<dim3(count, planes), 64, 0, stream>>>(src, src_pos0, dst, dst_pos0, head_dim, elem_bytes);
  return cudaGetLastError();
}

}  // namespace kvr::cuda
