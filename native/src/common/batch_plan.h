// Plans of the CUDA batched step (cuda/batch_step.cpp) that need no GPU: where an element of a
// contiguous or paged KV cache lives (kv_elem_index, shared by the kernels and the host copies),
// how a step's rows are cut into groups that fit the step's scratch (plan_groups), and the
// batched attention launch: its block list, split count and the partial-slot/merge maps
// (plan_batch_attention). g++-tested against the CPU's KvCache::at and plain loops
// (batch_plan_test.cpp). Not the kernels (cuda/k_attention.cu, k_rowwise.cu) nor CUDA calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/device_math.h"

namespace kvr::bp {

// One sequence's KV cache as the kernels address it. Contiguous: `base` is the sequence's own
// allocation (layer, {K,V}, kv_head, capacity, head_dim), table null, span = capacity. Paged:
// `base` is the pool arena of blocks (layer, {K,V}, kv_head, block_tokens, head_dim), `table` the
// block ids (device memory for kernels), span = block_tokens = 1 << shift.
struct KvView {
  void* base = nullptr;
  const uint32_t* table = nullptr;
  uint32_t span = 0;
  uint32_t shift = 0;
  uint64_t block_elems = 0;  // paged: elements per block (2·layers·kv_heads·span·head_dim)
};

// The plane of (layer, K = 0 / V = 1, kv head): (2·layer + which)·kv_heads + head.
KVR_HD uint32_t kv_plane(uint32_t layer, uint32_t which, uint32_t kv_heads, uint32_t head) {
  return (2 * layer + which) * kv_heads + head;
}

// Element offset from v.base of position p (< capacity; held when paged) of `plane`.
KVR_HD uint64_t kv_elem_index(const KvView& v, uint32_t plane, uint32_t p, uint32_t head_dim) {
  uint64_t block = 0;
  uint32_t off = p;
  if (v.table != nullptr) {
    block = static_cast<uint64_t>(v.table[p >> v.shift]) * v.block_elems;
    off = p & (v.span - 1);
  }
  return block + (static_cast<uint64_t>(plane) * v.span + off) * head_dim;
}

// Positions from p on that are contiguous in memory (to the end of p's block when paged).
KVR_HD uint32_t kv_run(const KvView& v, uint32_t p) {
  return v.table != nullptr ? v.span - (p & (v.span - 1)) : v.span - p;
}

// One sequence of a batched step as the kernels see it (a device array, one per piece).
struct SeqDesc {
  KvView kv;
  uint32_t row0 = 0;  // first row of the piece in the group's concatenated rows
  uint32_t n = 0;     // rows (new tokens) of the piece
  uint32_t pos0 = 0;  // cache position of its first row
  uint32_t pad = 0;
};

// A run of one entry's rows inside a group: entry `entry`, its tokens [offset, offset + n);
// `last`: the entry's last row is in this piece (its logits come from here).
struct Piece {
  uint32_t entry = 0;
  uint32_t offset = 0;
  uint32_t n = 0;
  bool last = false;
};

// Cuts entries of n[i] (>= 1) rows, in order, into groups of at most `cap` (>= 1) rows; an entry
// is split only where a group fills up, so a group holds at most one piece of each entry.
inline std::vector<std::vector<Piece>> plan_groups(const size_t* n, size_t count, size_t cap) {
  std::vector<std::vector<Piece>> groups;
  size_t room = 0;
  for (size_t e = 0; e < count; ++e) {
    size_t done = 0;
    while (done < n[e]) {
      if (room == 0) {
        groups.emplace_back();
        room = cap;
      }
      const size_t take = n[e] - done < room ? n[e] - done : room;
      Piece p;
      p.entry = static_cast<uint32_t>(e);
      p.offset = static_cast<uint32_t>(done);
      p.n = static_cast<uint32_t>(take);
      p.last = done + take == n[e];
      groups.back().push_back(p);
      done += take;
      room -= take;
    }
  }
  return groups;
}

// One batched attention launch over some pieces of a group (the decodes, or the longer pieces):
// grid (blocks, kv_heads, splits), kAttnWarps warps of rows_per_warp rows per block. Attention
// rows of a piece are its (token, head-in-group) pairs, n·group of them; the launch's rows are
// the pieces' rows one after the other (piece i from slot0[i]): that is the partial-slot index.
struct AttnBatchPlan {
  uint32_t rows_per_warp = 1, splits = 1, blocks = 0, total_rows = 0;
  std::vector<uint32_t> blk_piece;  // per block: piece index (into the launch's list)
  std::vector<uint32_t> blk_row0;   // per block: its first attention row within the piece
  std::vector<uint32_t> slot0;      // per piece: its first launch row
  std::vector<uint32_t> row_piece;  // per launch row (merge; only when splits > 1)
  std::vector<uint32_t> row_local;  // per launch row: attention row within its piece
  size_t partial_floats = 0;        // splits · kv_heads · total_rows · (head_dim + 2) when splits > 1
};

// n[i] new tokens of piece i whose keys end at ctx_end[i] (= pos0 + n). rows_per_warp: 1 when
// every piece is a decode or rows are few, else 4 (as plan_attention). Splits as plan_attention:
// about 2 blocks per SM, whole key tiles per split over the longest context; a piece with a
// shorter context leaves its trailing splits empty (they write m = -inf, l = 0).
inline AttnBatchPlan plan_batch_attention(const uint32_t* n, const uint32_t* ctx_end, size_t count, uint32_t group,
                                          uint32_t kv_heads, uint32_t head_dim, uint32_t sm_count,
                                          uint32_t fixed_splits = 0) {
  AttnBatchPlan p;
  uint32_t max_rows = 0, max_ctx = 1;
  for (size_t i = 0; i < count; ++i) {
    max_rows = n[i] * group > max_rows ? n[i] * group : max_rows;
    max_ctx = ctx_end[i] > max_ctx ? ctx_end[i] : max_ctx;
  }
  p.rows_per_warp = max_rows >= 8 * dm::kAttnWarps ? 4u : 1u;
  const uint32_t per_block = p.rows_per_warp * dm::kAttnWarps;
  p.slot0.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t rows = n[i] * group;
    p.slot0[i] = p.total_rows;
    for (uint32_t r = 0; r < rows; r += per_block) {
      p.blk_piece.push_back(static_cast<uint32_t>(i));
      p.blk_row0.push_back(r);
    }
    p.total_rows += rows;
  }
  p.blocks = static_cast<uint32_t>(p.blk_piece.size());
  if (fixed_splits > 0) {
    p.splits = fixed_splits < dm::kAttnMaxSplits ? fixed_splits : dm::kAttnMaxSplits;
  } else {
    const uint32_t blocks = p.blocks * kv_heads;
    const uint32_t want = blocks >= 2 * sm_count ? 1u : dm::ceil_div(2 * sm_count, blocks > 0 ? blocks : 1u);
    const uint32_t tiles = dm::ceil_div(max_ctx, dm::kAttnKeyTile);
    uint32_t s = want < tiles ? want : tiles;
    if (s > dm::kAttnMaxSplits) s = dm::kAttnMaxSplits;
    if (s == 0) s = 1;
    const uint32_t per = dm::ceil_div(tiles, s);
    p.splits = dm::ceil_div(tiles, per);
  }
  if (p.splits > 1) {
    p.row_piece.resize(p.total_rows);
    p.row_local.resize(p.total_rows);
    for (size_t i = 0; i < count; ++i)
      for (uint32_t r = 0; r < n[i] * group; ++r) {
        p.row_piece[p.slot0[i] + r] = static_cast<uint32_t>(i);
        p.row_local[p.slot0[i] + r] = r;
      }
    p.partial_floats = static_cast<size_t>(p.splits) * kv_heads * p.total_rows * (head_dim + 2);
  }
  return p;
}

}  // namespace kvr::bp
