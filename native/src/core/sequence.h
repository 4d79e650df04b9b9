// The kvr_seq handle's layout, internal to the library: a token sequence of one model. The
// neutral part (length, capacity, last error) lives here; the KV cache and scratch are the
// backend's SeqState. Also the one error path of calls on a sequence (seq_fail, seq_guarded).
// Shared by sequence.cpp (which implements kvr_seq_*), snapshot_chunk.cpp and projector.cpp
// (sequence → sequence projection). Not public ABI.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"
#include "core/model.h"

struct kvr_seq {
  std::shared_ptr<const kvr::Model> model;  // keeps the backend alive while the sequence exists
  std::unique_ptr<kvr::SeqState> state;     // declared after model: destroyed first
  uint32_t length = 0;
  uint32_t capacity = 0;
  std::string last_error;
  std::vector<float> logits;  // (vocab) logits of kvr_seq_decode_sample, never leave the library
};

namespace kvr {

// Records msg on the sequence and as this thread's last error; returns status.
int32_t seq_fail(kvr_seq* seq, int32_t status, const std::string& msg);

// Runs f (returning a status), turning a BackendError, std::bad_alloc or any other exception into
// a status recorded on seq ("... in <what>").
template <class F>
int32_t seq_guarded(kvr_seq* seq, const char* what, F&& f) {
  try {
    return f();
  } catch (const BackendError& e) {
    return seq_fail(seq, e.status, e.message);
  } catch (const std::bad_alloc&) {
    return seq_fail(seq, KVR_ERR_OUT_OF_MEMORY, format("out of memory in %s", what));
  } catch (const std::exception& e) {
    return seq_fail(seq, KVR_ERR_INTERNAL, format("internal error in %s: %s", what, e.what()));
  } catch (...) {
    return seq_fail(seq, KVR_ERR_INTERNAL, format("internal error in %s", what));
  }
}

}  // namespace kvr
