// The host ("copy path") snapshot chunk codec (chunk_codec.cpp): what Backend::export_chunk /
// import_chunk do by default (backend.cpp), through the backend's kv_read / kv_write. Arguments are
// already validated (snapshot_chunk.cpp); the contracts are Backend::export_chunk's and
// import_chunk's (backend.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.h"

namespace kvr {

// Encodes positions c.start .. c.start + tokens of s into frame (frame_len bytes, CRC32C last).
void host_export_chunk(const Backend& b, const SeqState& s, const ChunkSpec& c, uint8_t* frame, size_t frame_len);
// Checks frame (CRC32C, header, every value) and only then writes it into s.
void host_import_chunk(const Backend& b, SeqState& s, const ChunkSpec& c, const uint8_t* frame, size_t frame_len);

}  // namespace kvr
