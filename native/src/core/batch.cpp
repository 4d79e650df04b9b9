// The paged KV pool handle (kvr_kv_pool_*), paged sequences (kvr_seq_create_paged,
// kvr_seq_blocks) and the batched step (kvr_batch_step), backend-neutral: argument checks, block
// reservation all or none through the backend, then Backend::forward_batch. Not the pool's free
// list (kv_pool.h), the block table (kv_cache.h) nor the forward math (cpu/batch_forward.cpp).
#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "abi/test_paths.h"
#include "core/backend.h"
#include "core/errors.h"
#include "core/kv_pool_handle.h"
#include "core/model.h"
#include "core/sampler.h"
#include "core/sequence.h"
#include "host/dtype.h"
#include "host/parallel_for.h"

namespace kvr {
namespace {

constexpr uint32_t kMaxBatchSeqs = 4096;
constexpr size_t kMaxBatchRows = 65536;

// Records msg on every sequence of the batch (those not NULL) and as the thread's last error.
int32_t batch_fail(kvr_seq* const* seqs, uint32_t n, int32_t status, const std::string& msg) {
  fail(status, msg);
  if (seqs)
    for (uint32_t i = 0; i < n; ++i) {
      if (!seqs[i]) continue;
      try {
        seqs[i]->last_error = msg;
      } catch (...) {
        seqs[i]->last_error.clear();
      }
    }
  return status;
}

// The draws the backend left to the host (on CUDA the rows of the row route; the CPU step draws
// its rows in its own region, except in the default forward_batch or for a serial step), over the
// worker pool's threads when two or more
// of them are more than an argmax: a draw over the vocabulary (an exact exp per candidate, a
// top-p sort) costs ~0.1 ms on a 4096-token vocabulary, and a step's rows ran one after another
// on the calling thread. Each draw reads only its own row and writes only its own
// sampler (PRNG, buffers, history) and token (batch_impl refuses a sampler twice in a step), so
// which thread draws a row, and in what order, changes no bit. Allocates nothing: the step's
// lengths have already moved on, so only a row may fail now (sample_step_token).
void draw_rows(BatchEntry* batch, uint32_t n, int threads, bool serial) {
  auto draw = [batch](size_t i, unsigned) {
    const BatchEntry& e = batch[i];
    if (!e.sampler || e.sampled) return;  // sampled: the backend did it on its device
    sample_step_token(e.sampler, e.logits, e.width, e.token_out);
  };
  uint32_t drawn = 0;  // rows whose draw is more than an argmax
  for (uint32_t i = 0; i < n; ++i)
    if (batch[i].sampler && !batch[i].sampled && batch[i].sampler->cfg.temperature != 0) ++drawn;
  if (drawn < 2 || threads < 2 || serial) {
    for (uint32_t i = 0; i < n; ++i) draw(i, 0);
    return;
  }
  const int team = std::min<int>(threads, static_cast<int>(drawn));
  cpu::parallel_dynamic(cpu::Workers::kPool, team, n, [&](size_t i, unsigned t) { draw(i, t); });
}

// samplers (may be NULL = none): samplers[i] non-NULL samples sequence i's next token from its
// last row's logits[0..widths[i]) into tokens_out[i] (-1 when the row has no finite logit; the
// message is then on that sampler) instead of returning the row. serial_draws (the test library's
// kvr_test_batch_step_sample_serial): the backend returns the rows to sample as it returns logits
// and they are drawn one after another on this thread after the step — the oracle of the draws
// inside the CPU step's region and over the pool.
int32_t batch_impl(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                   size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len,
                   kvr_sampler* const* samplers, const uint32_t* widths, int32_t* tokens_out, bool serial_draws) {
  auto bad = [&](int32_t st, const std::string& msg) { return batch_fail(seqs, n_seqs, st, msg); };
  if (!seqs) return fail(KVR_ERR_INVALID_ARGUMENT, "seqs is NULL");
  if (n_seqs == 0 || n_seqs > kMaxBatchSeqs)
    return fail(KVR_ERR_INVALID_ARGUMENT, format("n_seqs must be in [1, %u], got %u", kMaxBatchSeqs, n_seqs));
  for (uint32_t i = 0; i < n_seqs; ++i)
    if (!seqs[i]) return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] is NULL", i));
  if (!n_tokens || !tokens || !want_logits)
    return bad(KVR_ERR_INVALID_ARGUMENT, "n_tokens, tokens or want_logits is NULL");
  const Model* model = seqs[0]->model.get();
  if (samplers && (!widths || !tokens_out))
    return bad(KVR_ERR_INVALID_ARGUMENT, "widths or tokens_out is NULL while samplers is not");
  std::unordered_set<const void*> seen;
  size_t rows = 0, want = 0, sampled = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    const kvr_seq* s = seqs[i];
    if (s->model.get() != model)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] belongs to another model than seqs[0]", i));
    if (!seen.insert(s).second) return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] appears twice", i));
    if (n_tokens[i] == 0) return bad(KVR_ERR_INVALID_ARGUMENT, format("n_tokens[%u] must be >= 1, got 0", i));
    if (want_logits[i] > 1)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("want_logits[%u] must be 0 or 1, got %u", i, want_logits[i]));
    if (n_tokens[i] > s->capacity - s->length)
      return bad(KVR_ERR_CAPACITY, format("seqs[%u]: %u tokens at length %u exceed capacity %u", i, n_tokens[i],
                                          s->length, s->capacity));
    if (samplers && samplers[i]) {
      if (want_logits[i])
        return bad(KVR_ERR_INVALID_ARGUMENT, format("seqs[%u] has a sampler and want_logits 1: choose one", i));
      if (widths[i] == 0 || widths[i] > model->vocab)
        return bad(KVR_ERR_INVALID_ARGUMENT,
                   format("widths[%u] must be in [1, vocab %zu], got %u", i, model->vocab, widths[i]));
      if (!seen.insert(samplers[i]).second)
        return bad(KVR_ERR_INVALID_ARGUMENT, format("samplers[%u] appears twice in the batch", i));
      if (samplers[i]->mask_tokens > model->vocab)
        return bad(KVR_ERR_OUT_OF_RANGE, format("samplers[%u]: its mask covers %u tokens, the vocabulary has %zu", i,
                                                samplers[i]->mask_tokens, model->vocab));
      ++sampled;
    }
    rows += n_tokens[i];
    want += want_logits[i];
    if (rows > kMaxBatchRows)
      return bad(KVR_ERR_INVALID_ARGUMENT, format("the step has more than %zu tokens", kMaxBatchRows));
  }
  if (tokens_len != rows)
    return bad(KVR_ERR_INVALID_ARGUMENT, format("tokens_len %zu must equal the sum of n_tokens %zu", tokens_len, rows));
  for (size_t r = 0; r < rows; ++r)
    if (tokens[r] < 0 || static_cast<size_t>(tokens[r]) >= model->vocab)
      return bad(KVR_ERR_OUT_OF_RANGE,
                 format("token id %d at index %zu is out of range [0, %zu)", tokens[r], r, model->vocab));
  if (want > 0 && !logits_out) return bad(KVR_ERR_INVALID_ARGUMENT, "logits_out is NULL");
  if (logits_len < want * model->vocab)
    return bad(KVR_ERR_INVALID_ARGUMENT, format("logits_len %zu is too small: need %zu (%zu rows x vocab %zu)",
                                                logits_len, want * model->vocab, want, model->vocab));

  // Storage, all or none: on a shortfall the sequences reserved so far give back what lies past
  // their length (their state before the call).
  const Backend& be = *model->backend;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    try {
      be.reserve(*seqs[i]->state, seqs[i]->length, static_cast<size_t>(seqs[i]->length) + n_tokens[i]);
    } catch (const BackendError& e) {
      for (uint32_t j = 0; j < i; ++j) be.shrink(*seqs[j]->state, seqs[j]->length);
      return bad(e.status, format("seqs[%u]: %s", i, e.message.c_str()));
    }
  }

  // Rows to sample go to a buffer of this thread (reused from step to step), in batch order like
  // the returned rows, so a backend can write either set with one GEMM.
  thread_local std::vector<float> sample_rows;
  if (sample_rows.size() < sampled * model->vocab) sample_rows.resize(sampled * model->vocab);
  std::vector<BatchEntry> batch(n_seqs);
  std::vector<float> spare(want + sampled < n_seqs ? model->vocab : 0);
  size_t off = 0, lrow = 0, srow = 0;
  for (uint32_t i = 0; i < n_seqs; ++i) {
    batch[i].s = seqs[i]->state.get();
    batch[i].tokens = tokens + off;
    batch[i].n = n_tokens[i];
    batch[i].pos0 = seqs[i]->length;
    if (want_logits[i]) batch[i].logits = logits_out + (lrow++) * model->vocab;
    if (samplers && samplers[i]) {
      batch[i].logits = sample_rows.data() + (srow++) * model->vocab;
      batch[i].sampler = samplers[i];
      batch[i].width = widths[i];
      batch[i].token_out = &tokens_out[i];
    }
    batch[i].spare = spare.empty() ? nullptr : spare.data();
    off += n_tokens[i];
  }
  // A serial step hides the samplers from the backend: the rows come back as logits rows.
  std::vector<kvr_sampler*> hidden(serial_draws ? n_seqs : 0);
  for (size_t i = 0; i < hidden.size(); ++i) std::swap(hidden[i], batch[i].sampler);
  be.forward_batch(batch.data(), n_seqs);
  for (size_t i = 0; i < hidden.size(); ++i) std::swap(hidden[i], batch[i].sampler);
  for (uint32_t i = 0; i < n_seqs; ++i) seqs[i]->length += n_tokens[i];
  if (sampled == 0) return KVR_OK;
  // Sampling failures stay with their row (its sampler's message); the step itself succeeded.
  // Under the model's kernel cap, as the step (cpu_features.h; auto on CUDA).
  const cpu::KernelScope scope(static_cast<cpu::KernelCap>(model->params.cpu_kernel));
  draw_rows(batch.data(), n_seqs, model->n_threads, serial_draws);
  return KVR_OK;
}

}  // namespace
}  // namespace kvr

using kvr::fail;
using kvr::format;

extern "C" {

KVR_API int32_t kvr_kv_pool_create(kvr_model* model, uint32_t n_blocks, uint32_t block_tokens,
                                   kvr_kv_pool** out_pool) {
  if (!out_pool) return fail(KVR_ERR_INVALID_ARGUMENT, "out_pool is NULL");
  *out_pool = nullptr;
  if (!model) return fail(KVR_ERR_INVALID_ARGUMENT, "model is NULL");
  if (n_blocks == 0) return fail(KVR_ERR_INVALID_ARGUMENT, "n_blocks must be >= 1, got 0");
  if (block_tokens < 8 || block_tokens > 1024 || (block_tokens & (block_tokens - 1)) != 0)
    return fail(KVR_ERR_INVALID_ARGUMENT,
                format("block_tokens must be a power of two in [8, 1024], got %u", block_tokens));
  const kvr::Model& m = *model->m;
  const size_t es = kvr::dtype_size(m.params.kv_dtype);
  const double bytes = 2.0 * m.layers * m.kv_heads * m.head_dim * es * block_tokens * static_cast<double>(n_blocks);
  if (bytes > 1.0e15)
    return fail(KVR_ERR_OUT_OF_MEMORY, format("a KV pool of %u blocks (%.0f bytes) is too large", n_blocks, bytes));
  try {
    auto pool = m.backend->create_pool(n_blocks, block_tokens);
    *out_pool = new kvr_kv_pool{model->m, std::move(pool)};
  } catch (const kvr::BackendError& e) {
    return fail(e.status, e.message);
  } catch (const std::bad_alloc&) {
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a KV pool");
  } catch (...) {
    return fail(KVR_ERR_INTERNAL, "internal error creating a KV pool");
  }
  return KVR_OK;
}

KVR_API void kvr_kv_pool_free(kvr_kv_pool* pool) { delete pool; }

KVR_API uint32_t kvr_kv_pool_blocks_total(const kvr_kv_pool* pool) { return pool ? pool->pool->blocks_total() : 0; }

KVR_API uint32_t kvr_kv_pool_blocks_free(const kvr_kv_pool* pool) { return pool ? pool->pool->blocks_free() : 0; }

KVR_API uint32_t kvr_kv_pool_block_tokens(const kvr_kv_pool* pool) { return pool ? pool->pool->block_tokens() : 0; }

KVR_API uint64_t kvr_kv_pool_block_bytes(const kvr_kv_pool* pool) { return pool ? pool->pool->block_bytes() : 0; }

KVR_API int32_t kvr_seq_create_paged(kvr_kv_pool* pool, uint32_t capacity, kvr_seq** out_seq) {
  if (!out_seq) return fail(KVR_ERR_INVALID_ARGUMENT, "out_seq is NULL");
  *out_seq = nullptr;
  if (!pool) return fail(KVR_ERR_INVALID_ARGUMENT, "pool is NULL");
  if (capacity == 0) return fail(KVR_ERR_INVALID_ARGUMENT, "capacity must be >= 1, got 0");
  kvr_seq* seq = nullptr;
  try {
    seq = new kvr_seq;
    seq->model = pool->model;
    seq->capacity = capacity;
    seq->state = pool->model->backend->create_paged_seq(pool->pool, capacity);
  } catch (const kvr::BackendError& e) {
    delete seq;
    return fail(e.status, e.message);
  } catch (const std::bad_alloc&) {
    delete seq;
    return fail(KVR_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
  } catch (...) {
    delete seq;
    return fail(KVR_ERR_INTERNAL, "internal error creating a sequence");
  }
  *out_seq = seq;
  return KVR_OK;
}

KVR_API uint32_t kvr_seq_blocks(const kvr_seq* seq) {
  return seq ? seq->model->backend->blocks_held(*seq->state) : 0;
}

KVR_API int32_t kvr_batch_step(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                               size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len) {
  return kvr_batch_step_sample(seqs, n_seqs, n_tokens, tokens, tokens_len, want_logits, logits_out, logits_len,
                               nullptr, nullptr, nullptr);
}

KVR_API int32_t kvr_batch_step_sample(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens,
                                      const int32_t* tokens, size_t tokens_len, const uint32_t* want_logits,
                                      float* logits_out, size_t logits_len, kvr_sampler* const* samplers,
                                      const uint32_t* widths, int32_t* tokens_out) {
  return kvr::batch_step_guarded(seqs, n_seqs, n_tokens, tokens, tokens_len, want_logits, logits_out, logits_len,
                                 samplers, widths, tokens_out, false);
}

}  // extern "C"

namespace kvr {

int32_t batch_step_guarded(kvr_seq* const* seqs, uint32_t n_seqs, const uint32_t* n_tokens, const int32_t* tokens,
                           size_t tokens_len, const uint32_t* want_logits, float* logits_out, size_t logits_len,
                           kvr_sampler* const* samplers, const uint32_t* widths, int32_t* tokens_out,
                           bool serial_draws) {
  const uint32_t n_rec = (seqs && n_seqs <= 4096) ? n_seqs : 0;  // sequences to record a failure on
  try {
    return kvr::batch_impl(seqs, n_seqs, n_tokens, tokens, tokens_len, want_logits, logits_out, logits_len,
                           samplers, widths, tokens_out, serial_draws);
  } catch (const kvr::BackendError& e) {
    return kvr::batch_fail(seqs, n_rec, e.status, e.message);
  } catch (const std::bad_alloc&) {
    return kvr::batch_fail(seqs, n_rec, KVR_ERR_OUT_OF_MEMORY, "out of memory in batch_step");
  } catch (const std::exception& e) {
    return kvr::batch_fail(seqs, n_rec, KVR_ERR_INTERNAL, format("internal error in batch_step: %s", e.what()));
  } catch (...) {
    return kvr::batch_fail(seqs, n_rec, KVR_ERR_INTERNAL, "internal error in batch_step");
  }
}

}  // namespace kvr
