// C ABI of snapshot chunk frames straight from / into a sequence: kvr_seq_chunk_bytes,
// kvr_seq_export_chunk, kvr_seq_import_chunk. Validates every argument (encoding, group, range,
// frame length) here, then calls the backend's export_chunk / import_chunk (chunk_codec.cpp for
// the host path, the CUDA backend's own on a GPU) and keeps the sequence length.
// Not the codec (chunk_codec.cpp) nor the container format (lib/snapshot).
#include <new>
#include <string>

#include "common/chunk_layout.h"
#include "core/backend.h"
#include "core/errors.h"
#include "core/model.h"
#include "core/sequence.h"  // struct kvr_seq

namespace kvr {
namespace {

// Builds the layout of a `tokens`-token chunk of seq's model, or a status on a bad encoding/group.
int32_t make_layout(kvr_seq* seq, const char* fn, uint32_t encoding, uint32_t group, uint32_t tokens,
                    chunk::Layout* out) {
  if (encoding > chunk::kEncQ4)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                      format("%s: encoding %u is not a kvr_kv_encoding (0 f32, 1 f16, 2 bf16, 3 q8, 4 q4)", fn,
                             encoding));
  if (encoding == chunk::kEncQ4 && (group == 0 || group > chunk::kMaxGroup))
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                      format("%s: q4 group_size %u outside [1, %u]", fn, group, chunk::kMaxGroup));
  if (encoding != chunk::kEncQ4 && group != 0)
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                      format("%s: group_size must be 0 for encoding %u, got %u", fn, encoding, group));
  if (tokens == 0) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: tokens must be >= 1, got 0", fn));
  const Model& m = *seq->model;
  out->encoding = encoding;
  out->group = group;
  out->layers = m.layers;
  out->heads = m.kv_heads;
  out->tokens = tokens;
  out->dim = m.head_dim;
  // layers <= 512, heads*dim bounded by the model, tokens < 2^32: the size stays far below 2^63.
  return KVR_OK;
}

int32_t check_frame(kvr_seq* seq, const char* fn, const void* frame, size_t frame_len, const chunk::Layout& L) {
  if (!frame) return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT, format("%s: frame is NULL", fn));
  if (frame_len != L.frame_bytes())
    return seq_fail(seq, KVR_ERR_INVALID_ARGUMENT,
                      format("%s: frame_len %zu, expected %zu for %zu tokens", fn, frame_len, L.frame_bytes(),
                             L.tokens));
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

using kvr::fail;
using kvr::format;

extern "C" {

KVR_API int32_t kvr_seq_chunk_bytes(const kvr_seq* cseq, uint32_t encoding, uint32_t group_size, uint32_t tokens,
                                    uint64_t* out) {
  if (!cseq) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_seq_chunk_bytes: seq is NULL");
  if (!out) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_seq_chunk_bytes: out is NULL");
  kvr_seq* seq = const_cast<kvr_seq*>(cseq);  // only last_error is written
  kvr::chunk::Layout L;
  if (int32_t st = kvr::make_layout(seq, "kvr_seq_chunk_bytes", encoding, group_size, tokens, &L)) return st;
  *out = L.frame_bytes();
  return KVR_OK;
}

KVR_API int32_t kvr_seq_export_chunk(const kvr_seq* cseq, uint32_t encoding, uint32_t group_size, uint32_t index,
                                     uint32_t start, uint32_t tokens, uint8_t* frame, size_t frame_len) {
  const char* fn = "kvr_seq_export_chunk";
  if (!cseq) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_seq_export_chunk: seq is NULL");
  kvr_seq* seq = const_cast<kvr_seq*>(cseq);  // only last_error is written
  return kvr::seq_guarded(seq, fn, [&] {
    kvr::ChunkSpec c;
    if (int32_t st = kvr::make_layout(seq, fn, encoding, group_size, tokens, &c.layout)) return st;
    const uint64_t end = static_cast<uint64_t>(start) + tokens;
    if (end > seq->length)
      return kvr::seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                             format("%s: range [%u, %llu) exceeds length %u", fn, start, (unsigned long long)end,
                                    seq->length));
    if (int32_t st = kvr::check_frame(seq, fn, frame, frame_len, c.layout)) return st;
    c.index = index;
    c.start = start;
    c.cache_dtype = seq->model->kv_dtype();
    seq->model->backend->export_chunk(*seq->state, c, frame, frame_len);
    return static_cast<int32_t>(KVR_OK);
  });
}

KVR_API int32_t kvr_seq_import_chunk(kvr_seq* seq, uint32_t encoding, uint32_t group_size, uint32_t index,
                                     uint32_t start, uint32_t tokens, const uint8_t* frame, size_t frame_len) {
  const char* fn = "kvr_seq_import_chunk";
  if (!seq) return fail(KVR_ERR_INVALID_ARGUMENT, "kvr_seq_import_chunk: seq is NULL");
  return kvr::seq_guarded(seq, fn, [&] {
    kvr::ChunkSpec c;
    if (int32_t st = kvr::make_layout(seq, fn, encoding, group_size, tokens, &c.layout)) return st;
    if (start > seq->length)
      return kvr::seq_fail(seq, KVR_ERR_OUT_OF_RANGE,
                             format("%s: start %u is past the length %u", fn, start, seq->length));
    const uint64_t end = static_cast<uint64_t>(start) + tokens;
    if (end > seq->capacity)
      return kvr::seq_fail(seq, KVR_ERR_CAPACITY,
                             format("%s: range [%u, %llu) exceeds capacity %u", fn, start, (unsigned long long)end,
                                    seq->capacity));
    if (int32_t st = kvr::check_frame(seq, fn, frame, frame_len, c.layout)) return st;
    c.index = index;
    c.start = start;
    c.cache_dtype = seq->model->kv_dtype();
    seq->model->backend->reserve(*seq->state, start, end);  // paged: blocks all or none
    seq->model->backend->import_chunk(*seq->state, c, frame, frame_len);
    seq->length = static_cast<uint32_t>(end);
    return static_cast<int32_t>(KVR_OK);
  });
}

}  // extern "C"
