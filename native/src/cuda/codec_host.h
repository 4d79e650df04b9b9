// Per-sequence staging of the device snapshot codec (codec_host.cpp): device frame buffer, CRC
// scratch, flags, two pinned slabs, a copy stream and events, grown on demand and owned by the
// CUDA sequence. Not the kernels (codec.cu, declared in handoff.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/backend.h"
#include "cuda/handoff.h"
#include "host/host_copy.h"

namespace kvr::cuda {

class CodecStaging {
 public:
  // The backend's status check (throws BackendError and marks the backend failed on a sticky
  // error).
  using Check = std::function<void(cudaError_t, const char*)>;
  // copy_threads: host threads for the pageable ↔ pinned copies (ParallelCopier).
  explicit CodecStaging(int copy_threads) : copier_(copy_threads) {}
  CodecStaging(const CodecStaging&) = delete;
  CodecStaging& operator=(const CodecStaging&) = delete;
  ~CodecStaging();
  // Backend::export_chunk / import_chunk for the device cache `kv`, ordered on `stream` (the
  // sequence's). Synchronous: the caller's frame is complete (export) or consumed and the cache
  // written (import) on return.
  void export_chunk(const DevKv& kv, const ChunkSpec& c, uint8_t* frame, size_t frame_len, cudaStream_t stream,
                    const Check& ck);
  void import_chunk(const DevKv& kv, const ChunkSpec& c, const uint8_t* frame, size_t frame_len,
                    cudaStream_t stream, const Check& ck);

 private:
  void reserve(size_t frame_len, size_t events, const Check& ck);
  cudaStream_t copy_stream_ = nullptr;
  void* frame_ = nullptr;  // device frame (frame_bytes_)
  size_t frame_bytes_ = 0;
  void* raw_ = nullptr;    // CRC pieces (u32)
  void* words_ = nullptr;  // device flags: export {bad u32, crc u32}; import {crc u32, pad, key u64}
  void* small_ = nullptr;  // pinned mirror of words_ (and the frame head)
  void* pinned_[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> events_;
  ParallelCopier copier_;
};

}  // namespace kvr::cuda
