// The kvr_seq handle's layout, internal to the library: a token sequence of one model with its own
// KV cache and scratch. Shared by sequence.cpp (which implements kvr_seq_*) and the few other
// entry points that read or write a sequence's cache in place (projector.cpp). Not public ABI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cpu/forward.h"
#include "kv_cache.h"
#include "model.h"

struct kvr_seq {
  std::shared_ptr<const kvr::Model> model;  // keeps the weights alive while the sequence exists
  kvr::KvCache kv;
  uint32_t length = 0;
  std::string last_error;
  kvr::cpu::Scratch scratch;
};
