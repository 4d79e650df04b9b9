// The CUDA backend's paged KV pool (backend_impl.h CudaPool): a device arena of blocks laid out
// like the CPU pool's (kv_pool.h, so kv_read/kv_write and snapshots see the same logical cache),
// the same free list, reference counts and all-or-none accounting (reserve with copy on write /
// shrink / blocks_held), and paged
// sequences holding block tables into it. Kernels read a paged cache through the table, uploaded
// with each step (batch_step.cpp). Not the batched forward itself. Compiled, not run.
#include <algorithm>
#include <memory>

#include "core/errors.h"
#include "cuda/backend_impl.h"
#include "host/dtype.h"

namespace kvr::cuda {

std::shared_ptr<PoolState> CudaBackend::create_pool(uint32_t n_blocks, uint32_t block_tokens) const {
  ensure_healthy();
  use_device();
  auto pool = std::make_shared<CudaPool>();
  pool->device = device_;
  KvPool& kp = pool->blocks;
  const size_t es = dtype_size(g_.kv_dtype());
  kp.dtype = g_.kv_dtype();
  kp.elem = es;
  kp.layers = g_.layers;
  kp.kv_heads = g_.kv_heads;
  kp.head_dim = g_.head_dim;
  kp.tokens_per_block = block_tokens;
  kp.n_blocks = n_blocks;
  kp.bytes_per_block = 2 * g_.layers * g_.kv_heads * g_.head_dim * es * block_tokens;
  const size_t bytes = kp.bytes_per_block * n_blocks;
  alloc_dev(pool->arena, bytes, "allocating the KV pool");
  // Zeroed once (as the CPU pool's calloc), on a stream of its own: nothing else waits for it.
  cudaStream_t st = nullptr;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaError_t e = cudaMemsetAsync(pool->arena.p, 0, bytes, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  cudaStreamDestroy(st);
  ck(e, "zeroing the KV pool");
  kp.init_free_list();
  return pool;
}

std::unique_ptr<SeqState> CudaBackend::create_paged_seq(const std::shared_ptr<PoolState>& pool,
                                                        uint32_t capacity) const {
  auto cp = std::dynamic_pointer_cast<CudaPool>(pool);
  if (!cp || cp->device != device_)
    throw BackendError(KVR_ERR_INVALID_ARGUMENT, "the pool belongs to another backend or device");
  ensure_healthy();
  use_device();
  auto s = std::make_unique<CudaSeq>();
  s->b = this;
  s->device = device_;
  s->capacity = capacity;
  s->pool = std::move(cp);
  // Only a stream (kv_read/kv_write and ordering): paged sequences run their forward passes
  // through the batched path, whose scratch belongs to the model (batch_step.cpp).
  ck(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

void CudaBackend::reserve(SeqState& ss, size_t from, size_t tokens) const {
  CudaSeq& s = static_cast<CudaSeq&>(ss);
  if (!s.paged()) return;
  KvPool& kp = s.pool->blocks;
  uint8_t* arena = static_cast<uint8_t*>(s.pool->arena.p);
  const size_t bpb = kp.bytes_per_block;
  // Copy on write of a shared block: device to device on the sequence's stream, finished before
  // the table points at the copy.
  const bool ok = kp.prepare_write(s.table, from, tokens, [&](uint32_t dst, uint32_t src) {
    use_device();
    ck(cudaMemcpyAsync(arena + dst * bpb, arena + src * bpb, bpb, cudaMemcpyDeviceToDevice, s.stream),
       "copying a shared KV block");
    ck(cudaStreamSynchronize(s.stream), "copying a shared KV block");
  });
  if (ok) return;
  const size_t bt = kp.tokens_per_block, want = (tokens + bt - 1) / bt;
  throw BackendError(KVR_ERR_POOL_EXHAUSTED,
                     format("KV pool exhausted: blocks for %zu positions (%zu held, shared ones copied on write) "
                            "of %zu tokens, %zu free",
                            tokens, std::min(want, s.table.size()), bt, kp.free_count()));
}

void CudaBackend::shrink(SeqState& ss, size_t tokens) const {
  CudaSeq& s = static_cast<CudaSeq&>(ss);
  if (!s.paged()) return;
  // Every call on the sequence ended with a synchronisation: no queued work uses these blocks.
  KvPool& kp = s.pool->blocks;
  const size_t keep = (tokens + kp.tokens_per_block - 1) / kp.tokens_per_block;
  if (keep >= s.table.size()) return;
  kp.release(s.table.data() + keep, s.table.size() - keep);
  s.table.resize(keep);
}

PagedView CudaBackend::paged(SeqState& ss) const {
  CudaSeq& s = static_cast<CudaSeq&>(ss);
  if (!s.paged()) return {};
  return {s.pool.get(), &s.table};
}

uint32_t CudaBackend::blocks_held(const SeqState& ss) const {
  return static_cast<uint32_t>(static_cast<const CudaSeq&>(ss).table.size());
}

}  // namespace kvr::cuda
