// The kvr_seq handle's layout, internal to the library: a token sequence of one model. The
// neutral part (length, capacity, last error) lives here; the KV cache and scratch are the
// backend's SeqState. Shared by sequence.cpp (which implements kvr_seq_*) and projector.cpp
// (sequence → sequence projection). Not public ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "model.h"

struct kvr_seq {
  std::shared_ptr<const kvr::Model> model;  // keeps the backend alive while the sequence exists
  std::unique_ptr<kvr::SeqState> state;     // declared after model: destroyed first
  uint32_t length = 0;
  uint32_t capacity = 0;
  std::string last_error;
  std::vector<float> logits;  // (vocab) logits of kvr_seq_decode_sample, never leave the library
};
