// g++ unit tests of common/batch_plan.h (the CUDA batched step's host plans): kv_elem_index and
// kv_run against the CPU backend's own addressing (kv_cache.h KvCache::at / run) for contiguous
// and paged caches of random geometry; plan_groups against the rows it was given (order, sizes,
// caps, one piece per entry per group); plan_batch_attention's coverage (every attention row of
// every piece in exactly one block, launch rows disjoint and dense, merge maps inverse of slot0,
// every key of every piece in exactly one split). Prints "batch_plan: N checks, M failed"; exit
// status 1 on any failure. Built by CMake; run by batch_plan_test.ts.
#include "common/batch_plan.h"
#include "test_check.h"

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/kv_cache.h"

namespace {

using kvr::test::check;

kvr::test::XorShift64 rng{0x2545f4914f6cdd1dull};
uint32_t rnd(uint32_t n) { return rng.below(n); }

// kv_elem_index · elem vs KvCache::at for one random geometry, contiguous and paged.
void test_addressing() {
  for (int trial = 0; trial < 200; ++trial) {
    const size_t layers = 1 + rnd(4), kvh = 1 + rnd(4), hd = 8u << rnd(3), elem = trial % 2 ? 2 : 4;
    const size_t bt = 8u << rnd(4), cap = 1 + rnd(300);
    // contiguous: addresses relative to a fake base
    kvr::KvCache c;
    c.elem = elem;
    c.layers = layers;
    c.kv_heads = kvh;
    c.head_dim = hd;
    c.capacity = cap;
    c.data = static_cast<uint8_t*>(std::calloc(2 * layers * kvh * cap * hd * elem, 1));  // freed by ~KvCache
    kvr::bp::KvView vc;
    vc.span = static_cast<uint32_t>(cap);
    // paged: a pool of enough blocks, a shuffled table
    auto pool = std::make_shared<kvr::KvPool>();
    pool->elem = elem;
    pool->layers = layers;
    pool->kv_heads = kvh;
    pool->head_dim = hd;
    pool->tokens_per_block = bt;
    pool->n_blocks = (cap + bt - 1) / bt + 3;
    pool->bytes_per_block = 2 * layers * kvh * bt * hd * elem;
    pool->data = static_cast<uint8_t*>(std::calloc(pool->n_blocks * pool->bytes_per_block, 1));  // ~KvPool frees
    pool->init_free_list();
    kvr::KvCache pc;
    pc.elem = elem;
    pc.layers = layers;
    pc.kv_heads = kvh;
    pc.head_dim = hd;
    pc.capacity = cap;
    pc.pool = pool;
    std::vector<uint32_t> scratch;
    scratch.reserve(3);
    pool->take(rnd(3), scratch);  // so the sequence's blocks are not 0, 1, 2...
    check(pc.reserve(0, cap), "reserve", 1, 0);
    kvr::bp::KvView vp;
    vp.table = pc.table.data();
    vp.span = static_cast<uint32_t>(bt);
    vp.shift = static_cast<uint32_t>(__builtin_ctzll(bt));
    vp.block_elems = pool->bytes_per_block / elem;
    for (int k = 0; k < 50; ++k) {
      const uint32_t l = rnd(static_cast<uint32_t>(layers)), w = rnd(2), g = rnd(static_cast<uint32_t>(kvh));
      const uint32_t p = rnd(static_cast<uint32_t>(cap));
      const uint32_t plane = kvr::bp::kv_plane(l, w, static_cast<uint32_t>(kvh), g);
      const uint64_t want_c = static_cast<uint64_t>(c.at(l, w, g, p) - c.data);
      const uint64_t got_c = kvr::bp::kv_elem_index(vc, plane, p, static_cast<uint32_t>(hd)) * elem;
      check(got_c == want_c, "contiguous address", got_c, want_c);
      const uint64_t want_p = static_cast<uint64_t>(pc.at(l, w, g, p) - pool->data);
      const uint64_t got_p = kvr::bp::kv_elem_index(vp, plane, p, static_cast<uint32_t>(hd)) * elem;
      check(got_p == want_p, "paged address", got_p, want_p);
      check(kvr::bp::kv_run(vc, p) == c.run(p), "contiguous run", kvr::bp::kv_run(vc, p), c.run(p));
      check(kvr::bp::kv_run(vp, p) == pc.run(p), "paged run", kvr::bp::kv_run(vp, p), pc.run(p));
    }
    pool->release(scratch.data(), scratch.size());
  }
}

void test_groups() {
  for (int trial = 0; trial < 500; ++trial) {
    const size_t count = 1 + rnd(70), cap = 1 + rnd(trial % 3 ? 600 : 8);
    std::vector<size_t> n(count);
    size_t total = 0;
    for (auto& x : n) total += (x = 1 + (rnd(4) ? 0 : rnd(900)));
    const auto groups = kvr::bp::plan_groups(n.data(), count, cap);
    std::vector<size_t> seen(count, 0);
    size_t rows = 0, last_entry = 0, pieces = 0;
    bool first = true;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const auto& g = groups[gi];
      size_t grows = 0;
      std::vector<int> in_group(count, 0);
      for (const auto& p : g) {
        check(p.n >= 1, "piece not empty", p.n, 1);
        check(p.offset == seen[p.entry], "pieces in order", p.offset, seen[p.entry]);
        check(first || p.entry >= last_entry, "entries in order", p.entry, last_entry);
        check(++in_group[p.entry] == 1, "one piece per entry per group", static_cast<unsigned long long>(in_group[p.entry]), 1);
        seen[p.entry] += p.n;
        check(p.last == (seen[p.entry] == n[p.entry]), "last flag", p.last, seen[p.entry] == n[p.entry]);
        grows += p.n;
        last_entry = p.entry;
        first = false;
        ++pieces;
      }
      check(grows <= cap, "group within cap", grows, cap);
      // only the last group may be short
      if (gi + 1 < groups.size()) check(grows == cap, "groups filled", grows, cap);
      rows += grows;
    }
    check(rows == total, "every row once", rows, total);
    for (size_t e = 0; e < count; ++e) check(seen[e] == n[e], "entry complete", seen[e], n[e]);
    check(pieces >= count, "pieces", pieces, count);
  }
}

void test_attention_plan() {
  for (int trial = 0; trial < 400; ++trial) {
    const size_t count = 1 + rnd(trial % 4 ? 80 : 4);
    const uint32_t group = 1u << rnd(3), kvh = 1 + rnd(8), hd = 32u << rnd(4), sms = 1 + rnd(140);
    std::vector<uint32_t> n(count), ctx(count);
    const bool decode = trial % 2 == 0;
    for (size_t i = 0; i < count; ++i) {
      n[i] = decode ? 1 : 1 + rnd(300);
      ctx[i] = n[i] + rnd(trial % 5 ? 3000 : 40);
    }
    const auto p = kvr::bp::plan_batch_attention(n.data(), ctx.data(), count, group, kvh, hd, sms);
    check(p.splits >= 1 && p.splits <= kvr::dm::kAttnMaxSplits, "splits in range", p.splits, kvr::dm::kAttnMaxSplits);
    check(p.blocks == p.blk_piece.size() && p.blocks == p.blk_row0.size(), "block arrays", p.blocks,
          p.blk_piece.size());
    if (decode) check(p.rows_per_warp == (group >= 32 ? 4u : 1u), "decode rows per warp", p.rows_per_warp, 1);
    const uint32_t per_block = p.rows_per_warp * kvr::dm::kAttnWarps;
    // every attention row of every piece covered by exactly one block
    std::vector<std::vector<int>> cover(count);
    uint32_t total = 0;
    for (size_t i = 0; i < count; ++i) {
      cover[i].assign(n[i] * group, 0);
      check(p.slot0[i] == total, "slots dense and in order", p.slot0[i], total);
      total += n[i] * group;
    }
    check(p.total_rows == total, "total rows", p.total_rows, total);
    for (uint32_t b = 0; b < p.blocks; ++b) {
      const uint32_t i = p.blk_piece[b];
      for (uint32_t r = p.blk_row0[b]; r < p.blk_row0[b] + per_block && r < n[i] * group; ++r) ++cover[i][r];
    }
    for (size_t i = 0; i < count; ++i)
      for (int c : cover[i]) check(c == 1, "row covered once", static_cast<unsigned long long>(c), 1);
    if (p.splits > 1) {
      check(p.partial_floats == static_cast<size_t>(p.splits) * kvh * total * (hd + 2), "partial floats",
            p.partial_floats, 0);
      for (size_t i = 0; i < count; ++i)
        for (uint32_t r = 0; r < n[i] * group; ++r) {
          check(p.row_piece[p.slot0[i] + r] == i, "merge piece", p.row_piece[p.slot0[i] + r], i);
          check(p.row_local[p.slot0[i] + r] == r, "merge row", p.row_local[p.slot0[i] + r], r);
        }
    } else {
      check(p.partial_floats == 0, "no partials without splits", p.partial_floats, 0);
    }
    // every key of every piece in exactly one split (the kernel's attn_split_range per piece)
    for (size_t i = 0; i < count; ++i) {
      uint32_t next = 0;
      for (uint32_t s = 0; s < p.splits; ++s) {
        uint32_t b, e;
        kvr::dm::attn_split_range(ctx[i], p.splits, s, &b, &e);
        if (b == e) continue;
        check(b == next, "splits contiguous", b, next);
        next = e;
      }
      check(next == ctx[i], "splits cover the context", next, ctx[i]);
    }
  }
  // many decodes fill the machine without splits
  std::vector<uint32_t> n(64, 1), ctx(64, 4000);
  const auto p = kvr::bp::plan_batch_attention(n.data(), ctx.data(), 64, 2, 8, 128, 132);
  check(p.splits == 1, "64 decodes x 8 kv heads: no split on 132 SMs", p.splits, 1);
  const auto q = kvr::bp::plan_batch_attention(n.data(), ctx.data(), 1, 2, 8, 128, 132);
  check(q.splits > 1, "one decode at 4000 keys splits", q.splits, 2);
}

}  // namespace

int main() {
  test_addressing();
  test_groups();
  test_attention_plan();
  return kvr::test::report("batch_plan");
}
