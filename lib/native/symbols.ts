// The Deno FFI symbol table of libkvrelay, mirroring native/include/kvrelay.h one entry per
// function. Grouped by header section so a new section (e.g. the snapshot codec) is one
// added object plus one spread in `symbols`. Not the place for argument checks (see sequence.ts).

// Signatures of the functions opened twice, as a call on a worker thread (`nonblocking`) and as
// a synchronous one under another key (`name` = the C function): one definition each.
const modelLoad = {
  parameters: ["buffer", "buffer", "usize", "u32", "buffer", "usize", "buffer"],
  result: "i32",
} as const;
const seqDecode = {
  parameters: ["pointer", "i32", "buffer", "usize"],
  result: "i32",
} as const;
const seqDecodeSample = {
  parameters: [
    "pointer",
    "i32",
    "pointer",
    "u32",
    "buffer",
    "buffer",
    "buffer",
    "buffer",
    "u32",
    "buffer",
  ],
  result: "i32",
} as const;
const batchStep = {
  parameters: ["buffer", "u32", "buffer", "buffer", "usize", "buffer", "buffer", "usize"],
  result: "i32",
} as const;
/** kvr_batch_step_sample's FFI signature (also the test library's serial-draws variant). */
export const batchStepSample = {
  parameters: [
    "buffer",
    "u32",
    "buffer",
    "buffer",
    "usize",
    "buffer",
    "buffer",
    "usize",
    "buffer",
    "buffer",
    "buffer",
  ],
  result: "i32",
} as const;

/** Core engine: version/errors, model, sequence, KV access. */
export const coreSymbols = {
  kvr_abi_version: { parameters: [], result: "u32" },
  /** a nonblocking no-op: its completion makes the event loop poll sockets (sync_step.ts) */
  kvr_abi_version_nonblocking: {
    name: "kvr_abi_version",
    parameters: [],
    result: "u32",
    nonblocking: true,
  },
  kvr_last_error: { parameters: [], result: "pointer" },
  kvr_model_default_params: { parameters: ["buffer"], result: "void" },
  // (params*, paths, paths_len, n_paths, tensors*, n_tensors, out_model**)
  kvr_model_load: modelLoad,
  // The same function on a worker thread (model loads can take seconds: weights are read and
  // packed). Its kvr_last_error() stays on that thread; see NativeModel.loadAsync.
  kvr_model_load_nonblocking: { ...modelLoad, name: "kvr_model_load", nonblocking: true },
  kvr_model_free: { parameters: ["pointer"], result: "void" },
  kvr_model_threads: { parameters: ["pointer"], result: "u32" },
  kvr_model_weight_bytes: { parameters: ["pointer"], result: "u64" },
  // (backend, device, info char*, info_len)
  kvr_backend_probe: { parameters: ["u32", "i32", "buffer", "usize"], result: "i32" },
  // (model, out_backend u32*, out_device u32*, info char*, info_len)
  kvr_model_backend: {
    parameters: ["pointer", "buffer", "buffer", "buffer", "usize"],
    result: "i32",
  },
  kvr_model_health: { parameters: ["pointer", "buffer", "usize"], result: "i32" },
  kvr_seq_create: { parameters: ["pointer", "u32", "buffer"], result: "i32" },
  kvr_seq_free: { parameters: ["pointer"], result: "void" },
  kvr_seq_length: { parameters: ["pointer"], result: "u32" },
  kvr_seq_capacity: { parameters: ["pointer"], result: "u32" },
  kvr_seq_last_error: { parameters: ["pointer"], result: "pointer" },
  // (seq, tokens i32*, n_tokens, all_positions, logits_out f32*, logits_len) — worker thread
  kvr_seq_prefill: {
    parameters: ["pointer", "buffer", "usize", "u32", "buffer", "usize"],
    result: "i32",
    nonblocking: true,
  },
  // (seq, token, logits_out f32*, logits_len) — worker thread
  kvr_seq_decode: { ...seqDecode, nonblocking: true },
  // The same function as a synchronous call, for short steps (lib/native/sync_step.ts).
  kvr_seq_decode_sync: { ...seqDecode, name: "kvr_seq_decode" },
  kvr_seq_truncate: { parameters: ["pointer", "u32"], result: "i32" },
  // (seq, layer, start, count, dtype, k, k_bytes, v, v_bytes)
  kvr_seq_kv_read: {
    parameters: ["pointer", "u32", "u32", "u32", "u32", "buffer", "usize", "buffer", "usize"],
    result: "i32",
  },
  kvr_seq_kv_write: {
    parameters: ["pointer", "u32", "u32", "u32", "u32", "buffer", "usize", "buffer", "usize"],
    result: "i32",
  },
  kvr_seq_set_length: { parameters: ["pointer", "u32"], result: "i32" },
} as const satisfies Deno.ForeignLibraryInterface;

/** KV snapshot codec (chunk quantize/dequantize). */
export const codecSymbols = {
  // (data u8*, len, crc, out u32*)
  kvr_crc32c: { parameters: ["buffer", "usize", "u32", "buffer"], result: "i32" },
  // (seq, encoding, group_size, tokens, out u64*)
  kvr_seq_chunk_bytes: { parameters: ["pointer", "u32", "u32", "u32", "buffer"], result: "i32" },
  // (seq, encoding, group_size, index, start, tokens, frame u8*, frame_len)
  kvr_seq_export_chunk: {
    parameters: ["pointer", "u32", "u32", "u32", "u32", "u32", "buffer", "usize"],
    result: "i32",
  },
  // (seq, encoding, group_size, index, start, tokens, frame u8*, frame_len)
  kvr_seq_import_chunk: {
    parameters: ["pointer", "u32", "u32", "u32", "u32", "u32", "buffer", "usize"],
    result: "i32",
  },
  // (x f32*, x_len, heads, tokens, head_dim, axis, codes i8*, codes_len, scales f32*, scales_len)
  kvr_kv_quantize_q8: {
    parameters: [
      "buffer",
      "usize",
      "u32",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (codes, codes_len, scales, scales_len, heads, tokens, head_dim, axis, out f32*, out_len)
  kvr_kv_dequantize_q8: {
    parameters: [
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (x, x_len, heads, tokens, head_dim, axis, group, codes u8*, codes_len, scales, scales_len,
  //  mins, mins_len)
  kvr_kv_quantize_q4: {
    parameters: [
      "buffer",
      "usize",
      "u32",
      "u32",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (codes, codes_len, scales, scales_len, mins, mins_len, heads, tokens, head_dim, axis, group,
  //  out f32*, out_len)
  kvr_kv_dequantize_q4: {
    parameters: [
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
      "u32",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
} as const satisfies Deno.ForeignLibraryInterface;

/** Cross-model KV projection — wrapped by lib/migrate/native.ts. */
export const migrateSymbols = {
  // (geometry*, start_pos, tokens, k_in, k_in_len, v_in, v_in_len, k_out, k_out_len, v_out, v_out_len)
  kvr_kv_to_features: {
    parameters: [
      "buffer",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  kvr_kv_from_features: {
    parameters: [
      "buffer",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (n_in, n_out, out_ridge**)
  kvr_ridge_create: { parameters: ["u32", "u32", "buffer"], result: "i32" },
  kvr_ridge_free: { parameters: ["pointer"], result: "void" },
  kvr_ridge_last_error: { parameters: ["pointer"], result: "pointer" },
  // (ridge, x, x_len, y, y_len, rows, n_threads) — worker thread
  kvr_ridge_accumulate: {
    parameters: ["pointer", "buffer", "usize", "buffer", "usize", "u32", "u32"],
    result: "i32",
    nonblocking: true,
  },
  // (k_ridge, v_ridge, src_seq, dst_seq, n_tokens, n_threads)
  kvr_ridge_accumulate_seq: {
    parameters: ["pointer", "pointer", "pointer", "pointer", "u32", "u32"],
    result: "i32",
    nonblocking: true,
  },
  kvr_ridge_rows: { parameters: ["pointer"], result: "u64" },
  // (ridge, g, g_len, c, c_len, yy, yy_len)
  kvr_ridge_stats: {
    parameters: ["pointer", "buffer", "usize", "buffer", "usize", "buffer", "usize"],
    result: "i32",
  },
  // (ridge, features u32*, n_sel, out_start, out_count, lambda, w_out f64*, w_len, bias_out, bias_len)
  kvr_ridge_solve: {
    parameters: [
      "pointer",
      "buffer",
      "u32",
      "u32",
      "u32",
      "f64",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (ridge, features, n_sel, out_start, out_count, w, w_len, bias, bias_len, sse, sse_len, sst, sst_len)
  kvr_ridge_sse: {
    parameters: [
      "pointer",
      "buffer",
      "u32",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
    ],
    result: "i32",
  },
  // (source*, target*, wk, wk_len, bk, bk_len, wv, wv_len, bv, bv_len, out**)
  kvr_projector_create: {
    parameters: [
      "buffer",
      "buffer",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
    ],
    result: "i32",
  },
  kvr_projector_free: { parameters: ["pointer"], result: "void" },
  kvr_projector_last_error: { parameters: ["pointer"], result: "pointer" },
  // (projector, start_pos, tokens, src_k, len, src_v, len, dst_k, len, dst_v, len, n_threads) — worker thread
  kvr_projector_apply: {
    parameters: [
      "pointer",
      "u32",
      "u32",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "buffer",
      "usize",
      "u32",
    ],
    result: "i32",
    nonblocking: true,
  },
  // (projector, src kvr_seq*, dst kvr_seq*, n_tokens, n_threads) — worker thread
  // (projector, keys, w_out, w_len)
  kvr_projector_weights: {
    parameters: ["pointer", "u32", "buffer", "usize"],
    result: "i32",
  },
  kvr_projector_apply_seq: {
    parameters: ["pointer", "pointer", "pointer", "u32", "u32"],
    result: "i32",
    nonblocking: true,
  },
} as const satisfies Deno.ForeignLibraryInterface;

/** Native sampling (issues 9/13): kvr_sampler_* — a logits row to a token id (+ logprobs). */
export const samplingSymbols = {
  kvr_sampling_default_params: { parameters: ["buffer"], result: "void" },
  // (params*, out_sampler**)
  kvr_sampler_create: { parameters: ["buffer", "buffer"], result: "i32" },
  kvr_sampler_free: { parameters: ["pointer"], result: "void" },
  kvr_sampler_last_error: { parameters: ["pointer"], result: "pointer" },
  // (sampler, penalty f64, seen_ids i32* | NULL, n_seen)
  kvr_sampler_set_repetition_penalty: {
    parameters: ["pointer", "f64", "buffer", "usize"],
    result: "i32",
  },
  // (sampler, ids i32* | NULL, bias f64* | NULL, n)
  kvr_sampler_set_logit_bias: {
    parameters: ["pointer", "buffer", "buffer", "usize"],
    result: "i32",
  },
  // (sampler, presence f64, frequency f64)
  kvr_sampler_set_presence_frequency: { parameters: ["pointer", "f64", "f64"], result: "i32" },
  // (sampler, min_tokens, stop_ids i32* | NULL, n_stop)
  kvr_sampler_set_min_tokens: { parameters: ["pointer", "u32", "buffer", "usize"], result: "i32" },
  // (sampler, logits f32*, logits_len, width, token_out i32*, logprob_out f64* | NULL,
  //  top_ids i32* | NULL, top_logprobs f64* | NULL, top_len, top_count_out u32* | NULL)
  kvr_sampler_sample: {
    parameters: [
      "pointer",
      "buffer",
      "usize",
      "u32",
      "buffer",
      "buffer",
      "buffer",
      "buffer",
      "u32",
      "buffer",
    ],
    result: "i32",
  },
  // (sampler, words u32* | NULL, words_len, n_tokens): the allowed-token mask (0 tokens = none)
  kvr_sampler_set_mask: { parameters: ["pointer", "buffer", "usize", "u32"], result: "i32" },
  // (sampler, keep 0/1): keep each draw's row for one redraw
  kvr_sampler_keep_row: { parameters: ["pointer", "u32"], result: "i32" },
  // (sampler, token_out i32*, logprob_out f64* | NULL, top_ids i32* | NULL,
  //  top_logprobs f64* | NULL, top_len, top_count_out u32* | NULL): the last draw, under the mask
  kvr_sampler_redraw: {
    parameters: ["pointer", "buffer", "buffer", "buffer", "buffer", "u32", "buffer"],
    result: "i32",
  },
  // (seq, token, sampler, width, token_out i32*, logprob_out f64* | NULL, top_ids | NULL,
  //  top_logprobs | NULL, top_len, top_count_out u32* | NULL) — worker thread
  kvr_seq_decode_sample: { ...seqDecodeSample, nonblocking: true },
  // The same function as a synchronous call, for short steps (lib/native/sync_step.ts).
  kvr_seq_decode_sample_sync: { ...seqDecodeSample, name: "kvr_seq_decode_sample" },
} as const satisfies Deno.ForeignLibraryInterface;

/** Every symbol opened by openNativeLibrary. */
/** Paged KV pool and the batched step (continuous batching). */
export const batchSymbols = {
  // (model, n_blocks, block_tokens, out_pool**)
  kvr_kv_pool_create: { parameters: ["pointer", "u32", "u32", "buffer"], result: "i32" },
  kvr_kv_pool_free: { parameters: ["pointer"], result: "void" },
  kvr_kv_pool_blocks_total: { parameters: ["pointer"], result: "u32" },
  kvr_kv_pool_blocks_free: { parameters: ["pointer"], result: "u32" },
  kvr_kv_pool_block_tokens: { parameters: ["pointer"], result: "u32" },
  kvr_kv_pool_block_bytes: { parameters: ["pointer"], result: "u64" },
  // (pool, capacity, out_seq**)
  kvr_seq_create_paged: { parameters: ["pointer", "u32", "buffer"], result: "i32" },
  kvr_seq_blocks: { parameters: ["pointer"], result: "u32" },
  // Block sharing: (seq, ids u32* | NULL, cap, n u32*), (seq, ids u32*, n_blocks, n_tokens),
  // (pool, ids u32*, n) ×2
  kvr_seq_block_table: { parameters: ["pointer", "buffer", "u32", "buffer"], result: "i32" },
  kvr_seq_adopt: { parameters: ["pointer", "buffer", "u32", "u32"], result: "i32" },
  kvr_kv_pool_ref: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
  kvr_kv_pool_unref: { parameters: ["pointer", "buffer", "u32"], result: "i32" },
  // (seqs kvr_seq**, n_seqs, n_tokens u32*, tokens i32*, tokens_len, want_logits u32*,
  //  logits_out f32*, logits_len) — worker thread
  kvr_batch_step: { ...batchStep, nonblocking: true },
  // (as kvr_batch_step, then samplers kvr_sampler**, widths u32*, tokens_out i32*) — worker thread
  kvr_batch_step_sample: { ...batchStepSample, nonblocking: true },
  // The same two on the calling thread, for short decode-only steps (lib/native/batch.ts).
  kvr_batch_step_sync: { ...batchStep, name: "kvr_batch_step" },
  kvr_batch_step_sample_sync: { ...batchStepSample, name: "kvr_batch_step_sample" },
} as const satisfies Deno.ForeignLibraryInterface;

export const symbols = {
  ...coreSymbols,
  ...codecSymbols,
  ...migrateSymbols,
  ...batchSymbols,
  ...samplingSymbols,
} as const;

/** The dlopen'ed symbol functions. */
export type KvrSymbols = Deno.DynamicLibrary<typeof symbols>["symbols"];
