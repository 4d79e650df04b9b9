// The CPU backend's per-sequence state (KV cache + forward scratch) and its cache accessor (what
// CpuBackend::host_cache answers for the neutral layer's in-place fast paths). The backend class
// itself is private to cpu_backend.cpp (make_cpu_backend).
#pragma once

#include "core/backend.h"
#include "core/kv_cache.h"
#include "cpu/forward.h"

namespace kvr::cpu {

struct CpuSeq final : SeqState {
  KvCache kv;
  Scratch scratch;
};

// The CPU cache of a sequence state, or nullptr when the state belongs to another backend.
inline const KvCache* cpu_cache(const SeqState* s) {
  const auto* c = dynamic_cast<const CpuSeq*>(s);
  return c ? &c->kv : nullptr;
}
inline KvCache* cpu_cache(SeqState* s) {
  auto* c = dynamic_cast<CpuSeq*>(s);
  return c ? &c->kv : nullptr;
}

}  // namespace kvr::cpu
