// Host orchestration of the device snapshot codec (codec.cu) for one CUDA sequence: a device
// frame buffer, two pinned slabs and a copy stream, so that encoding (compute stream), the PCIe
// copy (copy stream) and the host copy into the caller's frame overlap slab by slab on export,
// and the host copy and the upload overlap on import (host copies multi-threaded, ParallelCopier;
// slab plans in host_copy.h), where the checks (CRC32C, stored index,
// scales) complete before anything is written to the cache. Messages and statuses equal the
// host codec's (chunk_codec.cpp). Not the kernels (codec.cu) nor argument validation.
#include "cuda/codec_host.h"

#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>
#include <algorithm>

#include "core/errors.h"
#include "host/dtype.h"
#include "host/kv_values.h"
#include "kvrelay.h"

namespace kvr::cuda {
namespace {

constexpr size_t kSlabBytes = 4u << 20;  // pipelining granule (bytes of frame per slab)

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// One decoded element of a (host) frame, as codec.cu's decoded_value computes it (for messages).
float host_value(const chunk::Layout& L, const uint8_t* frame, size_t l, size_t part, size_t e) {
  const uint8_t* block = frame + (part ? L.v_offset(l) : L.k_offset(l));
  const size_t d = e % L.dim, t = (e / L.dim) % L.tokens, h = e / (L.dim * L.tokens);
  if (L.lossless()) return load_as_f32(block + e * L.elem_bytes(), L.encoding);
  if (L.encoding == chunk::kEncQ8) {
    const size_t si = part ? h * L.tokens + t : h * L.dim + d;
    const int8_t code = static_cast<int8_t>(block[(part ? L.q8_v_codes() : L.q8_k_codes()) + e]);
    return static_cast<float>(code) * load_f32(block + 4 * si);
  }
  const size_t g = part ? (h * L.tokens + t) * ((L.dim + L.group - 1) / L.group) + d / L.group
                        : (h * ((L.tokens + L.group - 1) / L.group) + t / L.group) * L.dim + d;
  const uint8_t byte = block[(part ? L.q4_v_codes() : L.q4_k_codes()) + e / 2];
  const float code = static_cast<float>((e & 1) ? byte >> 4 : byte & 0x0f);
  return load_f32(block + (part ? L.q4_v_mins() : L.q4_k_mins()) + 4 * g) + code * load_f32(block + 4 * g);
}

}  // namespace

CodecStaging::~CodecStaging() {
  if (copy_stream_) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (frame_) cudaFree(frame_);
  if (raw_) cudaFree(raw_);
  if (words_) cudaFree(words_);
  for (void* p : pinned_)
    if (p) cudaFreeHost(p);
  if (small_) cudaFreeHost(small_);
}

void CodecStaging::reserve(size_t frame_len, size_t events, const Check& ck) {
  if (!copy_stream_) ck(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "creating the codec stream");
  if (!words_) ck(cudaMalloc(&words_, 64), "allocating codec flags");
  if (!small_) ck(cudaHostAlloc(&small_, 64, cudaHostAllocDefault), "allocating pinned codec flags");
  if (frame_bytes_ < frame_len) {
    if (frame_) cudaFree(frame_);
    if (raw_) cudaFree(raw_);
    frame_ = nullptr;
    raw_ = nullptr;
    frame_bytes_ = 0;
    ck(cudaMalloc(&frame_, frame_len), "allocating the device chunk frame");
    ck(cudaMalloc(&raw_, ((frame_len + kCrcPiece - 1) / kCrcPiece + 1) * sizeof(uint32_t)),
       "allocating CRC pieces");
    frame_bytes_ = frame_len;
  }
  for (int i = 0; i < 2; ++i)
    if (!pinned_[i]) ck(cudaHostAlloc(&pinned_[i], kSlabBytes, cudaHostAllocDefault), "allocating pinned slabs");
  while (events_.size() < events) {
    cudaEvent_t e = nullptr;
    ck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating codec events");
    events_.push_back(e);
  }
}

void CodecStaging::export_chunk(const DevKv& kv, const ChunkSpec& c, uint8_t* frame, size_t frame_len,
                                cudaStream_t stream, const Check& ck) {
  const chunk::Layout& L = c.layout;
  const size_t body = frame_len - chunk::kFrameCrcBytes;
  // Slabs: runs of whole layers of about kSlabBytes (a layer larger than a slab is copied in
  // kSlabBytes pieces: export_slab_plan). events_: [0, 2) the copies into pinned slab 0 / 1, then
  // one per encoded run of layers.
  const std::vector<SlabPiece> plan = export_slab_plan(L.k_offset(0), L.layer_bytes(), L.layers, kSlabBytes);
  const size_t per_slab = layers_per_slab(L.layer_bytes(), kSlabBytes);
  reserve(frame_len, 2 + (L.layers + per_slab - 1) / per_slab, ck);
  uint32_t* d_bad = static_cast<uint32_t*>(words_);
  uint32_t* d_crc = d_bad + 1;
  ck(cudaMemsetAsync(d_bad, 0xff, 4, stream), "resetting codec flags");
  uint32_t head[2] = {c.index, static_cast<uint32_t>(L.tokens)};
  std::memcpy(frame, head, 8);
  std::memcpy(small_, head, 8);
  ck(cudaMemcpyAsync(frame_, small_, 8, cudaMemcpyHostToDevice, stream), "uploading the frame head");
  size_t drained = 0, encoded_to = 0;  // pieces copied into the caller's frame; layers encoded
  auto drain_one = [&] {  // the host copy of the oldest piece, once its PCIe copy is done
    const SlabPiece& p = plan[drained++];
    ck(cudaEventSynchronize(events_[p.buf]), "copying the chunk to the host");
    copier_.copy(frame + p.o0, pinned_[p.buf], p.o1 - p.o0);
  };
  for (size_t j = 0; j < plan.size(); ++j) {
    const SlabPiece& p = plan[j];
    if (p.after_layer > encoded_to) {  // encode the next run of layers first
      const size_t l0 = encoded_to;
      ck(launch_encode_layers(kv, L, c.start, l0, p.after_layer, static_cast<uint8_t*>(frame_), d_bad, stream),
         "encode launch");
      cudaEvent_t encoded = events_[2 + l0 / per_slab];
      ck(cudaEventRecord(encoded, stream), "recording the encode");
      ck(cudaStreamWaitEvent(copy_stream_, encoded, 0), "ordering the copy");
      encoded_to = p.after_layer;
    }
    if (j - drained == 2) drain_one();  // both slabs busy: free the older one
    ck(cudaMemcpyAsync(pinned_[p.buf], static_cast<uint8_t*>(frame_) + p.o0, p.o1 - p.o0, cudaMemcpyDeviceToHost,
                       copy_stream_),
       "copying the chunk to the host");
    ck(cudaEventRecord(events_[p.buf], copy_stream_), "recording the copy");
  }
  // The CRC over the whole body (head + payload), on the compute stream after every encode.
  ck(launch_crc32c(static_cast<uint8_t*>(frame_), body, static_cast<uint32_t*>(raw_), d_crc, false, stream),
     "crc launch");
  ck(cudaMemcpyAsync(small_, d_bad, 8, cudaMemcpyDeviceToHost, stream), "reading codec flags");
  while (drained < plan.size()) drain_one();
  ck(cudaStreamSynchronize(stream), "export_chunk");
  uint32_t flags[2];
  std::memcpy(flags, small_, 8);
  if (flags[0] != UINT32_MAX) {
    const size_t layer = flags[0] / 2;
    throw BackendError(KVR_ERR_INVALID_ARGUMENT,
                       format("chunk %u layer %zu: %s holds NaN or infinity (%s needs finite KV)", c.index, layer,
                              flags[0] % 2 ? "V" : "K", L.encoding == chunk::kEncQ8 ? "q8" : "q4"));
  }
  std::memcpy(frame + body, &flags[1], 4);
}

void CodecStaging::import_chunk(const DevKv& kv, const ChunkSpec& c, const uint8_t* frame, size_t frame_len,
                                cudaStream_t stream, const Check& ck) {
  const chunk::Layout& L = c.layout;
  const size_t body = frame_len - chunk::kFrameCrcBytes;
  const std::vector<SlabPiece> plan = import_slab_plan(frame_len, kSlabBytes);
  reserve(frame_len, 2, ck);
  // Upload: host copy into pinned slab j while slab j-1 crosses PCIe.
  cudaEvent_t done[2] = {events_[0], events_[1]};
  bool used[2] = {false, false};
  for (const SlabPiece& p : plan) {
    if (used[p.buf]) ck(cudaEventSynchronize(done[p.buf]), "uploading the chunk");
    copier_.copy(pinned_[p.buf], frame + p.o0, p.o1 - p.o0);
    ck(cudaMemcpyAsync(static_cast<uint8_t*>(frame_) + p.o0, pinned_[p.buf], p.o1 - p.o0, cudaMemcpyHostToDevice,
                       copy_stream_),
       "uploading the chunk");
    ck(cudaEventRecord(done[p.buf], copy_stream_), "recording the upload");
    used[p.buf] = true;
  }
  ck(cudaStreamWaitEvent(stream, done[plan.back().buf], 0), "ordering the decode");
  uint32_t* d_crc = static_cast<uint32_t*>(words_);
  auto* d_key = reinterpret_cast<unsigned long long*>(static_cast<uint8_t*>(words_) + 8);
  ck(cudaMemsetAsync(d_key, 0xff, 8, stream), "resetting codec flags");
  ck(launch_crc32c(static_cast<uint8_t*>(frame_), body, static_cast<uint32_t*>(raw_), d_crc, false, stream),
     "crc launch");
  ck(launch_check_scales(L, static_cast<uint8_t*>(frame_), d_key, stream), "scale check launch");
  ck(cudaMemsetAsync(d_key + 1, 0xff, 8, stream), "resetting codec flags");
  ck(launch_check_values(L, c.cache_dtype, static_cast<uint8_t*>(frame_), d_key + 1, stream), "value check launch");
  ck(cudaMemcpyAsync(small_, words_, 24, cudaMemcpyDeviceToHost, stream), "reading codec flags");
  ck(cudaStreamSynchronize(stream), "import_chunk checks");
  uint32_t crc;
  unsigned long long key;
  std::memcpy(&crc, small_, 4);
  std::memcpy(&key, static_cast<uint8_t*>(small_) + 8, 8);
  const uint32_t stored = load_u32(frame + body);
  if (stored != crc)
    throw BackendError(KVR_ERR_CHECKSUM, format("chunk %u checksum mismatch: stored crc32c 0x%x, computed 0x%x",
                                                c.index, stored, crc));
  const uint32_t got_index = load_u32(frame), got_tokens = load_u32(frame + 4);
  if (got_index != c.index || got_tokens != L.tokens)
    throw BackendError(KVR_ERR_CORRUPT,
                       format("chunk frame says index %u/%u tokens where the table expects %u/%u", got_index,
                              got_tokens, c.index, static_cast<uint32_t>(L.tokens)));
  if (key != ~0ull) {
    const size_t sel = static_cast<size_t>(key >> 32), i = static_cast<size_t>(key & 0xffffffffu);
    const size_t layer = sel / 4, part = (sel / 2) % 2, is_min = sel % 2;
    const bool q8 = L.encoding == chunk::kEncQ8;
    const size_t block = part ? L.v_offset(layer) : L.k_offset(layer);
    const size_t mins = part ? L.q4_v_mins() : L.q4_k_mins();
    const double v = load_f32(frame + block + (is_min ? mins : 0) + 4 * i);
    (void)q8;
    throw BackendError(KVR_ERR_CORRUPT,
                       is_min ? format("chunk %u layer %zu %s: min %zu is %g (must be finite)", c.index, layer,
                                       part ? "V" : "K", i, v)
                              : format("chunk %u layer %zu %s: scale %zu is %g (must be finite and >= 0)", c.index,
                                       layer, part ? "V" : "K", i, v));
  }
  unsigned long long vkey;
  std::memcpy(&vkey, static_cast<uint8_t*>(small_) + 16, 8);
  if (vkey != ~0ull) {  // the host codec's message: decode the element again here
    const size_t sel = static_cast<size_t>(vkey >> 32), e = static_cast<size_t>(vkey & 0xffffffffu);
    const size_t layer = sel / 2, part = sel % 2;
    const float x = host_value(L, frame, layer, part, e);
    throw BackendError(KVR_ERR_CORRUPT,
                       value_fault_message(x, c.cache_dtype, c.index, layer, part != 0, e, L.tokens, L.dim, c.start));
  }
  ck(launch_decode_chunk(kv, L, c.start, static_cast<uint8_t*>(frame_), stream), "decode launch");
  ck(cudaStreamSynchronize(stream), "import_chunk");
}

}  // namespace kvr::cuda
