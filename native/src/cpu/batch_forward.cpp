// CPU batched forward step (see batch_forward.h): the CPU's one layer loop. Rows of all sequences
// are concatenated: row r belongs to sequence seq_of[r] at position pos_of[r]. A sequence's result
// differs from running it alone (a step of one sequence) only by GEMM row blocking and attention
// split points (float summation order).
//
// Threads: the whole step is ONE region on the persistent WorkerPool (host/worker_pool.h), every
// thread running the layer loop through the same stages (cpu/stage_units.h: units of work
// claimed owner-first, a stage ends when its units are finished). Not OpenMP: Deno calls the step
// from whichever thread of its blocking pool is free and libgomp keeps one team per calling
// thread, so the second core gave the step nothing (measured: 1 vs 2 threads 1.27 vs 1.34 ms for
// a 32-row tiny-fast step inside Deno; a C harness got 1.7–2.0×). Units: GEMMs by chunks of
// weight panels (a thread takes its own share first, the same panels every step, so its part of
// the weights stays in its core's cache), row ops by chunks of rows, attention by a decode row or
// a block of a prefill chunk's rows for one kv head.
#include "cpu/batch_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "common/device_math.h"
#include "core/sampler.h"
#include "cpu/attention.h"
#include "cpu/decode_attention.h"
#include "cpu/ops.h"
#include "cpu/stage_units.h"
#include "host/convert.h"
#include "host/gemm.h"
#include "host/gemm_amx.h"
#include "host/worker_pool.h"

namespace kvr::cpu {
namespace {

// Query rows of a prefill chunk per attention unit: enough units for the threads to balance a
// long chunk (row i's cost grows with its position), few enough that claiming stays negligible —
// attention()'s query block: each unit reads its sequence's keys and values once per block, so
// 16-row units read them 15 times for a 240-row chunk where 24-row ones read them 10 times (a
// 240-token tiny-powerful chunk at positions 1680–1920 with 16 decodes: 34.0–34.2 ms with 24-row
// units, 37.8–39.0 ms with 16-row ones).
constexpr size_t kAttnRows = kAttnQueryBlock;

// Rows a prepared row block (and a group of whole sequences, below) holds at least: a full AMX
// tile, so the kernel chosen — and the bits — are those of the panel split.
constexpr size_t kBlockRows = 16;
// GEMM row blocks per thread of a many-row step (prefill chunks): 2, so a late thread's share
// can be taken over.
constexpr size_t kGemmBlocksPerThread = 2;
static_assert(kBlockRows >= amx::kMinRows, "a row block must take the kernel the panel split takes");

// q8/q4 weights (their int8 activation rounding keeps them off the paths below that would change
// a row's bits with the batch's composition: see forward_stages).
bool int8_weights(const Weights& w) {
  const PackedWeight& w0 = w.layer.empty() ? w.lm_head : w.layer[0].qkv;
  return w0.is_q8() || w0.is_q4() || w.lm_head.is_q8() || w.lm_head.is_q4();
}

// Cost of a sequence's part of a step in multiply-adds: its rows through the layers, its last
// row's lm_head when it wants logits, and its attention — weighted ×4 per multiply-add against the
// GEMMs', the ratio measured on the 32-row tiny-fast step (attention 21 % of the time for 4 % of
// the multiply-adds).
double step_cost(const ModelGeometry& m, const BatchSeq& s) {
  const double per_row =
      static_cast<double>(m.layers * (m.hidden * (m.q_dim + 2 * m.kv_dim) + m.q_dim * m.hidden + 3 * m.hidden * m.inter));
  const double ctx = static_cast<double>(s.pos0) + static_cast<double>(s.n + 1) / 2;
  const double attn = 4.0 * 2.0 * static_cast<double>(m.layers * m.q_dim) * ctx;
  const double head = s.logits ? static_cast<double>(m.hidden * m.vocab) : 0.0;
  return static_cast<double>(s.n) * (per_row + attn) + head;
}

// Splits the step into `nt` groups of whole sequences, group g = seqs [(*bounds)[g], (*bounds)[g+1]),
// each of at least kBlockRows rows and none costing over 1.15× the even share; false when the
// step has no such split (too few rows, or one sequence's prefill chunk outweighs the rest).
bool plan_groups(const ModelGeometry& m, const BatchSeq* seqs, size_t count, unsigned nt, std::vector<size_t>* bounds) {
  std::vector<double> cost(count);
  double total = 0;
  size_t rows = 0;
  for (size_t e = 0; e < count; ++e) {
    total += cost[e] = step_cost(m, seqs[e]);
    rows += seqs[e].n;
  }
  if (rows < nt * kBlockRows) return false;
  bounds->assign(1, 0);
  double acc = 0;
  for (size_t e = 0; e < count && bounds->size() < nt; ++e) {
    const double target = total * static_cast<double>(bounds->size()) / nt;
    // End the group before e when that lands closer to the target than ending it after e.
    if (acc + cost[e] >= target) {
      const bool before = target - acc < acc + cost[e] - target && e > bounds->back();
      bounds->push_back(before ? e : e + 1);
      if (!before) {
        acc += cost[e];
        continue;
      }
    }
    acc += cost[e];
  }
  if (bounds->size() != nt) return false;
  bounds->push_back(count);
  const double cap = 1.15 * total / nt;
  for (unsigned g = 0; g < nt; ++g) {
    double c = 0;
    size_t n = 0;
    for (size_t e = (*bounds)[g]; e < (*bounds)[g + 1]; ++e) {
      c += cost[e];
      n += seqs[e].n;
    }
    if (n < kBlockRows || c > cap) return false;
  }
  return true;
}

}  // namespace

// Many rows of whole sequences (the decode-heavy step of a busy scheduler): each thread runs one
// group of sequences through every layer by itself, with no stage between the threads at all.
// The row-block split below already gave each thread its own rows, but its ~38 stages per step
// (9 per layer) made the threads wait for each other at each one: on the 32-row tiny-fast step
// a fifth of both threads' time went to stage waits (perf). A group's rows take the
// kernels the stage split takes (at least kBlockRows rows: tiles and AMX compute row by row), so
// results do not depend on the split. Groups are claimed, not assigned: a worker that arrives
// late (or is preempted) leaves its group to the first thread done.
void forward_batch(const ModelGeometry& m, const Weights& w, BatchSeq* seqs, size_t count, BatchScratch& sc) {
  if (count == 1 && seqs[0].n == 1 && seqs[0].logits) {  // a lone decode: its thread count tuned
    decode_tuned(m, w, seqs[0], sc);
    return;
  }
  const unsigned nt = static_cast<unsigned>(std::max(m.n_threads, 1));
  const bool quantized = int8_weights(w);
  std::vector<size_t> bounds;
  if (nt < 2 || quantized || !plan_groups(m, seqs, count, nt, &bounds)) {
    // The draws as the step's last stage, claimed row by row by the threads already in the region
    // (after the step, on the calling thread alone, 4 tiny-powerful rows took ~0.4-0.6 ms: an
    // exact exp per logit, the top-p sort).
    forward_stages(m, w, seqs, count, sc, nt, true);
    for (size_t e = 0; e < count; ++e) seqs[e].sampled = seqs[e].sampler && seqs[e].logits;
    return;
  }
  if (sc.groups.size() < nt) sc.groups.resize(nt);
  for (auto& g : sc.groups)
    if (!g) g = std::make_unique<BatchScratch>();
  struct Ctx {
    const ModelGeometry& m;
    const Weights& w;
    BatchSeq* seqs;
    const std::vector<size_t>& bounds;
    BatchScratch& sc;
    std::atomic<uint32_t> next{0};
    std::atomic<bool> failed{false};
  } ctx{m, w, seqs, bounds, sc};
  WorkerPool::shared().run(
      nt,
      [](void* p, unsigned, unsigned) {
        Ctx& c = *static_cast<Ctx*>(p);
        const size_t groups = c.bounds.size() - 1;
        for (size_t g = c.next.fetch_add(1, std::memory_order_relaxed); g < groups;
             g = c.next.fetch_add(1, std::memory_order_relaxed)) {
          try {
            forward_stages(c.m, c.w, c.seqs + c.bounds[g], c.bounds[g + 1] - c.bounds[g], *c.sc.groups[g], 1);
          } catch (...) {
            c.failed.store(true, std::memory_order_relaxed);
            continue;
          }
          // The group's draws while its rows are in this core's cache, both threads at once
          // (after the step, the caller's thread alone took ~25 µs for 32 greedy rows).
          for (size_t e = c.bounds[g]; e < c.bounds[g + 1]; ++e) {
            BatchSeq& s = c.seqs[e];
            if (!s.sampler || !s.logits) continue;
            sample_step_token(s.sampler, s.logits, s.width, s.token_out);
            s.sampled = true;
          }
        }
      },
      &ctx);
  if (ctx.failed.load(std::memory_order_relaxed)) throw std::bad_alloc();
}

unsigned forward_stages(const ModelGeometry& m, const Weights& w, const BatchSeq* seqs, size_t count, BatchScratch& sc,
                        unsigned nt, bool draw) {
  const size_t H = m.hidden, I = m.inter, hd = m.head_dim, half = hd / 2;
  const size_t qd = m.q_dim, kvd = m.kv_dim, ldqkv = qd + 2 * kvd;
  const size_t group = m.heads / m.kv_heads;
  const float eps = m.params.rms_norm_eps;
  const LayerPlan& lp = m.layer_plan;  // the layers' recipe (core/layer_plan.h)
  const size_t pw = kPanelWidth;
  // gate and up panels line up when I is a multiple of the panel width: a thread's gate panels
  // [a, b) and up panels [I/16 + a, I/16 + b) give it whole SwiGLU columns (no extra stage).
  const bool fused_swiglu = I % pw == 0;
  const bool quantized = int8_weights(w);

  // The step's plan (sc.plan: reused, so a one-row step allocates nothing).
  StepPlan& plan = sc.plan;
  std::vector<size_t>& row0 = plan.row0;
  row0.resize(count);
  size_t rows = 0;
  for (size_t e = 0; e < count; ++e) {
    row0[e] = rows;
    rows += seqs[e].n;
  }
  if (rows == 0) return nt;

  // One row (a lone decode) takes the same stages with fewer waits between them: a one-row step
  // of the many-row stages spent its time waiting at ~8 stages per layer of units a few
  // microseconds long. So for one row:
  // - no norm stages: each thread norms the row into its own copy on its first unit of the GEMV
  //   that reads it (same bits: RMSNorm of one row is the same sums on any thread);
  // - attention per GQA group, fused with the group's QKV columns, q/k norms, RoPE and KV write
  //   (`group_units`: head_dim whole panels, and enough groups to go round the threads), else
  //   QKV by panel chunks, then the group's scores and values by blocks of kDecodeBlock
  //   positions (`block_units`), each thread adding the blocks' partials itself before its first
  //   O unit; decode_attention_group runs the same phases in the same order, so the bits do not
  //   depend on which. Groups, not query heads, are the unit: per head, tiny-balanced's 3 heads
  //   on 2 threads ran 2:1 and each head re-read its group's K/V;
  // - GEMV chunks of about 2 units per thread (each claim and completion is an atomic on a line
  //   both cores write, ~0.1–0.2 µs), and the embedding before the region.
  const bool one = rows == 1;
  const bool group_units = one && hd % pw == 0 && (m.kv_heads % nt == 0 || m.kv_heads >= 2 * nt);
  const bool block_units = one && !group_units;

  auto r16 = [](size_t n) { return (n + 15) & ~size_t{15}; };
  const size_t h_each = r16(H);  // one row: each thread's normed copy of x
  const size_t need = rows * (2 * H + ldqkv + qd + 2 * I + hd) + (one ? nt * h_each : 0);
  if (sc.main.size() < need) sc.main.resize(need);
  float* x = sc.main.data();        // (rows, H) residual stream
  float* h = x + rows * H;          // (rows, H) normed
  float* qkv = h + rows * H;        // (rows, q_dim + 2 kv_dim)
  float* att = qkv + rows * ldqkv;  // (rows, q_dim)
  float* gu = att + rows * qd;      // (rows, 2I)
  float* cs = gu + rows * 2 * I;    // (rows, hd): cos (half) then sin (half)
  float* h_own = cs + rows * hd;    // one row: (nt, h_each)
  std::vector<size_t>& seq_of = plan.seq_of;
  std::vector<size_t>& pos_of = plan.pos_of;
  seq_of.resize(rows);
  pos_of.resize(rows);
  for (size_t e = 0; e < count; ++e)
    for (size_t i = 0; i < seqs[e].n; ++i) {
      seq_of[row0[e] + i] = e;
      pos_of[row0[e] + i] = seqs[e].pos0 + i;
    }

  // Attention units: a prefill chunk's row blocks per kv head (half the work of a block of all
  // heads, so the threads end a stage closer together), and the decodes. Each unit runs on one
  // thread with its own scratch slice. Laid out so that thread t's share (stage_units.h) holds
  // the blocks of its own kv heads, longest work first, then its part of the decodes: a thread
  // reads the keys and values of its heads only, which stay in its core's cache from one block
  // to the next (one kv head of a 1,920-token tiny-powerful context is 1 MiB, both 2 MiB).
  AttnArgs base;
  base.ldq = ldqkv;
  base.heads = m.heads;
  base.kv_heads = m.kv_heads;
  base.head_dim = hd;
  base.ldo = qd;
  auto unit_args = [&](const AttnUnit& u) {
    AttnArgs a = base;
    const BatchSeq& s = seqs[u.seq];
    a.kv = s.kv;
    a.q = qkv + (row0[u.seq] + u.r0) * ldqkv;
    a.out = att + (row0[u.seq] + u.r0) * qd;
    a.n = u.r1 - u.r0;
    a.pos0 = s.pos0 + u.r0;
    return a;
  };
  std::vector<AttnUnit>& units = plan.units;
  std::vector<AttnUnit>& decodes = plan.decodes;
  units.clear();
  decodes.clear();
  size_t attn_floats = 0;
  for (size_t e = 0; e < count && !one; ++e)  // one row: its own units (below)
    if (seqs[e].n == 1) decodes.push_back({e, 0, 1, kAllHeads});
  for (unsigned t = 0; t < nt && !one; ++t) {
    for (size_t g = t * m.kv_heads / nt; g < (t + 1) * m.kv_heads / nt; ++g)
      for (size_t e = 0; e < count; ++e) {
        const size_t n = seqs[e].n;
        if (n < 2) continue;
        for (size_t r = 0; r < n; r += kAttnRows) units.push_back({e, r, std::min(n, r + kAttnRows), g});
      }
    units.insert(units.end(), decodes.begin() + t * decodes.size() / nt, decodes.begin() + (t + 1) * decodes.size() / nt);
  }
  for (const AttnUnit& u : units) {
    const AttnArgs a = unit_args(u);
    // A decode scores its whole context in one pass (decode_attention.h).
    attn_floats = std::max(attn_floats, a.n == 1 ? decode_attention_scratch_floats(a) : attention_group_scratch_floats(a));
  }
  // One row by blocks: per thread, a block's converted keys or values, its own roped copy of a
  // group's query heads and its own combined attention row; per group, the blocks' partials
  // (shared, after every thread's slice).
  const AttnArgs one_args = unit_args({0, 0, 1, kAllHeads});
  const size_t nb = block_units ? decode_blocks(one_args) : 0;
  const size_t parts_each = block_units ? r16(decode_parts_floats(one_args)) : 0;
  if (group_units) attn_floats = decode_attention_scratch_floats(one_args);
  if (block_units) attn_floats = decode_block_scratch_floats(one_args) + r16(group * hd) + r16(qd);
  attn_floats = r16(attn_floats);
  if (sc.attn.size() < attn_floats * nt + m.kv_heads * parts_each) sc.attn.resize(attn_floats * nt + m.kv_heads * parts_each);
  float* parts_base = sc.attn.data() + attn_floats * nt;
  auto parts = [&](size_t g) { return decode_parts(one_args, parts_base + g * parts_each); };

  // lm_head plan: each wanting sequence's last row, normed into compacted rows of h, then one
  // GEMM per run of rows whose destinations follow each other in memory (batch.cpp lays out
  // returned rows and rows to sample as two such runs) — straight into the callers' rows.
  std::vector<size_t>& want_rows = plan.want_rows;  // source row of compacted row k
  std::vector<HeadRun>& runs = plan.runs;
  want_rows.clear();
  runs.clear();
  for (size_t e = 0; e < count; ++e) {
    if (!seqs[e].logits) continue;
    const size_t first = seqs[e].all_rows ? 0 : seqs[e].n - 1;
    for (size_t i = first; i < seqs[e].n; ++i) {
      const size_t k = want_rows.size();
      float* dst = seqs[e].logits + (i - first) * m.vocab;
      want_rows.push_back(row0[e] + i);
      if (!runs.empty() && runs.back().dst + runs.back().len * m.vocab == dst) {
        ++runs.back().len;
      } else {
        runs.push_back({k, 1, dst});
      }
    }
  }

  // Rows to draw (the last stage): one unit each, in any thread (each reads its own row and
  // writes its own sampler and token, so the bits are those of drawing them one by one).
  std::vector<size_t>& draws = plan.draws;
  draws.clear();
  if (draw)
    for (size_t e = 0; e < count; ++e)
      if (seqs[e].sampler && seqs[e].logits) draws.push_back(e);

  // Units per stage (the same for every thread; stage_units.h): rows in chunks, GEMM weight
  // panels in chunks, about 4 units per thread each so a preempted thread's share is taken over
  // (one row: about 2, at least 2 panels; the lm_head at least 8 panels, about 4 per thread).
  auto chunk_of = [&](size_t count) {
    return one ? std::max<size_t>(2, count / (2 * nt)) : std::max<size_t>(1, (count + 4 * nt - 1) / (4 * nt));
  };
  auto units_of = [](size_t count, size_t chunk) { return static_cast<uint32_t>((count + chunk - 1) / chunk); };
  const size_t row_chunk = chunk_of(rows);
  const uint32_t row_units = units_of(rows, row_chunk);
  const size_t per_layer =
      (one ? (group_units ? 4 : 6) : 8) + (fused_swiglu ? 0 : 1);  // stages, as the loop below runs them
  const size_t n_stages = m.layers * per_layer + (one ? 1 : 2) + 1;  // + the draws
  if (sc.stage_count < n_stages) {
    sc.stages.reset(new StageCounter[n_stages]);
    sc.stage_count = n_stages;
  }
  for (size_t i = 0; i < n_stages; ++i) {  // published to the workers by the pool's region start
    sc.stages[i].done.v.store(0, std::memory_order_relaxed);
    for (auto& c : sc.stages[i].next) c.v.store(0, std::memory_order_relaxed);
  }
  std::atomic<uint32_t> sleepers{0};
  std::atomic<bool> failed{false};

  // GEMM split. One row (a lone decode): GEMV by panel chunks on x in place. Few rows: panel
  // chunks, each thread packing the input once per GEMM (gemm_pack_a) for all the chunks it
  // takes. Many rows (prefill chunks): row blocks, each against every panel (the packing is then
  // per block, and each block's rows are many enough to reuse every weight slice).
  //
  // Few rows but at least 16 (an AMX tile) per thread, f32/bf16 layer weights: one prepared row
  // block per thread instead of panel chunks — the rows' activations then stay in the cache of the core that
  // made them (the row stages and attention give each thread the same rows), where a panel split
  // moved every GEMM's input and output between the cores (32-row tiny-fast step: 0.51–0.53 ms
  // against 0.59 ms with panel chunks). Each output's sums do not depend on which rows share a block (tiles and AMX
  // work row by row), and every block has at least amx::kMinRows rows, so the kernel chosen — and
  // the bits — are those of the panel split. Blocks of fewer than 16 rows would leave AMX tiles
  // half empty: 16 tiny-powerful decodes took 1.7 instead of 1.5 ms with 8-row blocks. Not for
  // q8/q4 weights (kept on their panel split).
  enum class Split { kGemv, kPanels, kRows };
  constexpr size_t kFewRows = 48;
  const size_t row_blocks = std::min<size_t>(nt, rows / kBlockRows);
  const bool prepared_blocks = rows > 1 && rows < kFewRows && row_blocks >= 2 && !quantized;
  const Split split = one                                   ? Split::kGemv
                      : rows >= kFewRows || prepared_blocks ? Split::kRows
                                                            : Split::kPanels;
  if (sc.prepared.size() < nt) sc.prepared.resize(nt);  // prepared GEMM inputs and the lm_head
  // Row blocks of the kRows split: prepared ones balanced (block b: rows [b·rows/n, (b+1)·rows/n));
  // else kGemmBlocksPerThread per thread (one block on one thread) holding whole kernel tiles,
  // spread evenly — 32 rows (two AMX row tiles) for AMX bf16 weights, else the kernels' tile (16
  // rows with AVX-512 tall tiles, 6 with AVX2), the partial tile last. Tiles that do not fit the
  // kernel's leave a tail per block (a 128-row tiny-fast prefill on one thread in 6-row-granular
  // blocks of 66 + 62 rows: 1.86 against 1.59 ms in one block); blocks rounded up to whole tiles
  // instead of spread leave the last thread short (272 rows as 80, 80, 80, 32). While the last
  // block has fewer than kBlockRows rows it joins the one before: a 1-row block would take the
  // GEMV, other bits than the tiles, and AMX needs amx::kMinRows.
  const bool amx_layers = split == Split::kRows && !w.layer.empty() && amx::applies(w.layer[0].qkv, kBlockRows);
  const size_t granule = amx_layers ? 32 : split == Split::kRows ? gemm_row_group() : 1;  // AMX: SplitRows's 2 tiles of 16 rows
  const size_t tiles = (rows + granule - 1) / granule;
  const size_t blocks_wanted = nt == 1 ? 1 : kGemmBlocksPerThread * nt;
  size_t gemm_blocks = std::min({blocks_wanted, tiles, std::max<size_t>(1, rows / kBlockRows)});
  auto block_start = [&](size_t u) { return std::min(rows, u * tiles / gemm_blocks * granule); };
  while (gemm_blocks > 1 && rows - block_start(gemm_blocks - 1) < kBlockRows) --gemm_blocks;
  const uint32_t gemm_row_units = static_cast<uint32_t>(prepared_blocks ? row_blocks : gemm_blocks);
  auto row_block = [&](uint32_t u, size_t* r0, size_t* r1) {
    if (prepared_blocks) {
      *r0 = u * rows / row_blocks;
      *r1 = (u + 1) * rows / row_blocks;
    } else {
      *r0 = block_start(u);
      *r1 = u + 1 == gemm_blocks ? rows : block_start(u + 1);
    }
  };

  // The row's embedding and RoPE angles; one row's are made here, many rows' in the first stage.
  auto embed = [&](size_t r) {
    const BatchSeq& s = seqs[seq_of[r]];
    embed_row(w, static_cast<size_t>(s.tokens[pos_of[r] - s.pos0]), H, x + r * H);
    for (size_t d = 0; d < half; ++d)  // the same bits as the CUDA backend (common/device_math.h)
      dm::rope_cos_sin(static_cast<uint32_t>(pos_of[r]), m.inv_freq[d], &cs[r * hd + d], &cs[r * hd + half + d]);
  };
  if (one) embed(0);
  // Row r's key and value head g after the QKV projection: Qwen3 k-norm, RoPE, written to the
  // cache at the row's position; and one query head in place: Qwen3 q-norm, RoPE.
  auto key_value = [&](size_t l, const LayerWeights& L, size_t r, size_t g) {
    float* kr = qkv + r * ldqkv + qd + g * hd;
    const float* c = cs + r * hd;
    if (lp.qk_norm) rmsnorm(kr, kr, L.k_norm.data(), hd, eps);
    rope(kr, c, c + half, half);
    KvCache& kv = *seqs[seq_of[r]].kv;
    from_f32(kr, kv.dtype, kv.at(l, 0, g, pos_of[r]), hd);
    from_f32(kr + kvd, kv.dtype, kv.at(l, 1, g, pos_of[r]), hd);
  };
  auto query = [&](const LayerWeights& L, size_t r, float* qr) {
    const float* c = cs + r * hd;
    if (lp.qk_norm) rmsnorm(qr, qr, L.q_norm.data(), hd, eps);
    rope(qr, c, c + half, half);
  };

  auto body = [&](unsigned t, unsigned T) {
    StageCounter* st = sc.stages.get();
    auto stage = [&](uint32_t total, auto&& unit) { run_stage(*st++, total, t, T, sleepers, unit); };
    // Rows [r0, r1) of row unit u.
    auto row_range = [&](uint32_t u, size_t* r0, size_t* r1) {
      *r0 = u * row_chunk;
      *r1 = std::min(rows, *r0 + row_chunk);
    };
    PreparedRows* prep = split == Split::kPanels || prepared_blocks ? &sc.prepared[t] : nullptr;
    float* scratch = sc.attn.data() + t * attn_floats;
    float* hmine = h_own + t * h_each;
    float* qloc = scratch + (block_units ? decode_block_scratch_floats(one_args) : 0);  // one row by blocks
    float* attl = qloc + r16(group * hd);
    // y rows [r0, r1) (+)= a · Wᵀ (+ bias) on panels [p0, p1) of W (a, y: row r0's start);
    // prepared: a's rows as this thread prepared them (kPanels). A failure (only std::bad_alloc of a
    // thread's first packing scratch) is carried out by hand: the unit still counts as done so
    // the others finish, and the step throws after the region.
    auto gemm = [&](const float* a, size_t m, size_t lda, bool prepared, const PackedWeight& W, const float* bias,
                    float* y, size_t ldy, bool acc, size_t p0, size_t p1) {
      try {
        if (prepared) {
          prep->gemm_range(W, y, ldy, acc, p0, p1);
        } else if (m == 1) {  // gemm_range's own dispatch for one row, without its wrapper per unit
          gemv_range(a, W, y, acc, p0, std::min(p1, W.panels()));
        } else {
          gemm_range(a, m, lda, W, y, ldy, acc, p0, p1);
        }
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        return;
      }
      if (!bias || p0 >= p1) return;
      const size_t c0 = p0 * pw, c1 = std::min(p1 * pw, W.rows());
      for (size_t r = 0; r < m; ++r) add_inplace(y + r * ldy + c0, bias + c0, c1 - c0);
    };
    // Prepares a (rows, W.cols()) for this thread's chunks of a GEMM on W; false on failure (the
    // thread's chunks of that GEMM are then skipped and the step throws after the region).
    auto prepare = [&](const float* a, size_t lda, const PackedWeight& W) {
      try {
        prep->prepare(a, rows, lda, W);
        return true;
      } catch (...) {
        failed.store(true, std::memory_order_relaxed);
        return false;
      }
    };
    // A GEMM's input rows: `input()` gives them, called by each thread on its first unit of the
    // stage — h, att or gu as the stages before left them, or one row's own per-thread input
    // (normed, below; its attention row by blocks).
    auto normed = [&](const std::vector<float>& weight) {
      return [&, wd = weight.data()]() -> const float* {
        if (!one) return h;  // normed by a stage of its own
        rmsnorm(x, hmine, wd, H, eps);
        return hmine;
      };
    };
    // A GEMM stage y (+)= input() · Wᵀ (+ bias) over every row and panel; `after(r0, r1, c0, c1)`
    // runs on the block just computed (rows [r0, r1), columns [c0, c1)), by the same thread.
    auto gemm_stage = [&](auto&& input, size_t lda, const PackedWeight& W, const float* bias, float* y, size_t ldy,
                          bool acc, auto&& after) {
      const float* a = nullptr;
      if (split == Split::kRows) {
        stage(gemm_row_units, [&](uint32_t u) {
          if (!a) a = input();
          size_t r0, r1;
          row_block(u, &r0, &r1);
          if (prepared_blocks) {
            try {
              prep->prepare(a + r0 * lda, r1 - r0, lda, W);
            } catch (...) {
              failed.store(true, std::memory_order_relaxed);
              return;
            }
          }
          gemm(a + r0 * lda, r1 - r0, lda, prepared_blocks, W, bias, y + r0 * ldy, ldy, acc, 0, W.panels());
          after(r0, r1, size_t{0}, W.rows());
        });
        return;
      }
      const size_t panels = W.panels(), chunk = chunk_of(panels);
      bool ready = false;
      stage(units_of(panels, chunk), [&](uint32_t u) {
        if (!a) a = input();
        if (split == Split::kPanels && !ready && !(ready = prepare(a, lda, W))) return;
        const size_t p0 = u * chunk, p1 = std::min(panels, (u + 1) * chunk);
        gemm(a, rows, lda, split == Split::kPanels, W, bias, y, ldy, acc, p0, p1);
        after(size_t{0}, rows, p0 * pw, std::min(p1 * pw, W.rows()));
      });
    };
    auto nothing = [](size_t, size_t, size_t, size_t) {};
    auto norm_stage = [&](const std::vector<float>& weight) {
      if (one) return;  // normed by each thread inside the next GEMM (normed)
      stage(row_units, [&](uint32_t u) {
        size_t r0, r1;
        row_range(u, &r0, &r1);
        for (size_t r = r0; r < r1; ++r) rmsnorm(x + r * H, h + r * H, weight.data(), H, eps);
      });
    };

    for (size_t l = 0; l < m.layers; ++l) {
      const LayerWeights& L = w.layer[l];
      // The plan's biases (nullptr: none).
      const float* qkv_bias = lp.qkv_bias ? L.qkv_bias.data() : nullptr;
      const float* o_bias = lp.o_bias ? L.o_bias.data() : nullptr;
      const float* gate_up_bias = lp.mlp_bias ? L.gate_up_bias.data() : nullptr;
      const float* down_bias = lp.mlp_bias ? L.down_bias.data() : nullptr;
      AttnArgs la = one_args;  // one row: per thread, the shared template stays read-only
      la.layer = l;
      if (l == 0 && !one) {  // the embeddings (and RoPE angles) of a row chunk, then its first norm
        stage(row_units, [&](uint32_t u) {
          size_t r0, r1;
          row_range(u, &r0, &r1);
          for (size_t r = r0; r < r1; ++r) {
            embed(r);
            rmsnorm(x + r * H, h + r * H, L.attn_norm.data(), H, eps);
          }
        });
      } else {
        norm_stage(L.attn_norm);
      }

      if (group_units) {  // one row: a GQA group's QKV columns, keys, values, queries, attention
        const float* a = nullptr;
        auto input = normed(L.attn_norm);
        stage(static_cast<uint32_t>(m.kv_heads), [&](uint32_t g) {
          if (!a) a = input();
          const size_t spans[3][2] = {{g * group * hd, (g + 1) * group * hd},
                                      {qd + g * hd, qd + (g + 1) * hd},
                                      {qd + kvd + g * hd, qd + kvd + (g + 1) * hd}};
          for (const auto& c : spans) gemm(a, 1, H, false, L.qkv, qkv_bias, qkv, ldqkv, false, c[0] / pw, c[1] / pw);
          key_value(l, L, 0, g);
          for (size_t hh = g * group; hh < (g + 1) * group; ++hh) query(L, 0, qkv + hh * hd);
          decode_attention_group(la, g, scratch);
        });
      } else {
        gemm_stage(normed(L.attn_norm), H, L.qkv, qkv_bias, qkv, ldqkv, false, nothing);
      }

      if (block_units) {  // one row: scores, then values, per (group, block of positions)
        stage(static_cast<uint32_t>(m.kv_heads * nb), [&](uint32_t u) {
          const size_t g = u / nb, b = u % nb;
          if (b == nb - 1) key_value(l, L, 0, g);  // the block holding the row's position
          std::copy(qkv + g * group * hd, qkv + (g + 1) * group * hd, qloc);
          for (size_t r = 0; r < group; ++r) query(L, 0, qloc + r * hd);  // on this thread's copy
          decode_scores_block(la, g, qloc, b, parts(g), scratch);
        });
        stage(static_cast<uint32_t>(m.kv_heads * nb), [&](uint32_t u) {
          decode_values_block(la, u / nb, u % nb, parts(u / nb), scratch);
        });
      } else if (!one) {
        stage(row_units, [&](uint32_t u) {
          size_t r0, r1;
          row_range(u, &r0, &r1);
          for (size_t r = r0; r < r1; ++r) {
            for (size_t g = 0; g < m.kv_heads; ++g) key_value(l, L, r, g);
            for (size_t hh = 0; hh < m.heads; ++hh) query(L, r, qkv + r * ldqkv + hh * hd);
          }
        });  // every row's keys are in its cache before any attention reads them

        stage(static_cast<uint32_t>(units.size()), [&](uint32_t u) {
          AttnArgs a = unit_args(units[u]);
          a.layer = l;
          if (units[u].g == kAllHeads) {
            decode_attention(a, scratch);
          } else {
            attention_group(a, units[u].g, scratch);
          }
        });
      }

      gemm_stage(
          [&]() -> const float* {
            if (!block_units) return att;
            for (size_t g = 0; g < m.kv_heads; ++g) decode_combine(la, g, parts(g), attl + g * group * hd);
            return attl;
          },
          qd, L.o, o_bias, x, H, true, nothing);
      norm_stage(L.mlp_norm);

      if (fused_swiglu && split != Split::kRows) {
        // A unit: gate panels [p0, p1) and the up panels of the same columns, then their SwiGLU.
        const size_t gp = I / pw, chunk = chunk_of(gp);
        bool ready = false;
        const float* a = nullptr;
        auto input = normed(L.mlp_norm);
        stage(units_of(gp, chunk), [&](uint32_t u) {
          if (!a) a = input();
          if (split == Split::kPanels && !ready && !(ready = prepare(a, H, L.gate_up))) return;
          const size_t p0 = u * chunk, p1 = std::min(gp, (u + 1) * chunk);
          const bool pk = split == Split::kPanels;
          gemm(a, rows, H, pk, L.gate_up, gate_up_bias, gu, 2 * I, false, p0, p1);
          gemm(a, rows, H, pk, L.gate_up, gate_up_bias, gu, 2 * I, false, gp + p0, gp + p1);
          for (size_t r = 0; r < rows; ++r) {
            float* row = gu + r * 2 * I;
            swiglu(row + p0 * pw, row + I + p0 * pw, row + p0 * pw, (p1 - p0) * pw);
          }
        });
      } else if (split == Split::kRows) {  // a row block's gate/up, then its SwiGLU
        gemm_stage(normed(L.mlp_norm), H, L.gate_up, gate_up_bias, gu, 2 * I, false,
                   [&](size_t r0, size_t r1, size_t, size_t) {
                     for (size_t r = r0; r < r1; ++r) swiglu(gu + r * 2 * I, gu + r * 2 * I + I, gu + r * 2 * I, I);
                   });
      } else {
        gemm_stage(normed(L.mlp_norm), H, L.gate_up, gate_up_bias, gu, 2 * I, false, nothing);
        stage(row_units, [&](uint32_t u) {
          size_t r0, r1;
          row_range(u, &r0, &r1);
          for (size_t r = r0; r < r1; ++r) swiglu(gu + r * 2 * I, gu + r * 2 * I + I, gu + r * 2 * I, I);
        });
      }
      gemm_stage([&] { return static_cast<const float*>(gu); }, 2 * I, L.down, down_bias, x, H, true, nothing);
    }

    const size_t wn = want_rows.size(), wchunk = chunk_of(wn);
    if (!one) {
      stage(units_of(wn, wchunk), [&](uint32_t u) {
        for (size_t k = u * wchunk; k < std::min(wn, (u + 1) * wchunk); ++k)
          rmsnorm(x + want_rows[k] * H, h + k * H, w.final_norm.data(), H, eps);
      });
    }
    const size_t vp = w.lm_head.panels();
    const size_t vchunk = one ? std::max<size_t>(8, vp / (4 * nt)) : chunk_of(vp);
    // One run of several rows (every wanted row returned, or every one sampled: the usual
    // decode step): each thread prepares the input once for all its panel chunks, as above.
    const bool head_prepared = runs.size() == 1 && wn > 1 && wn < kFewRows;
    if (head_prepared && !prep) prep = &sc.prepared[t];
    bool head_ready = false;
    const float* a = nullptr;
    auto input = normed(w.final_norm);
    stage(wn == 0 ? 0 : units_of(vp, vchunk), [&](uint32_t u) {
      if (!a) a = input();
      const size_t p0 = u * vchunk, p1 = std::min(vp, (u + 1) * vchunk);
      if (head_prepared) {
        if (!head_ready) {
          try {
            prep->prepare(a, wn, H, w.lm_head);
          } catch (...) {
            failed.store(true, std::memory_order_relaxed);
            return;
          }
          head_ready = true;
        }
        prep->gemm_range(w.lm_head, runs[0].dst, m.vocab, false, p0, p1);
        return;
      }
      for (const HeadRun& run : runs) {
        try {
          gemm_range(a + run.row0 * H, run.len, H, w.lm_head, run.dst, m.vocab, false, p0, p1);
        } catch (...) {
          failed.store(true, std::memory_order_relaxed);
        }
      }
    });
    // Every lm_head unit is finished here (stage_units.h). No draw after a failure: the step
    // throws, and a sampler must not advance for a step that did not happen.
    stage(static_cast<uint32_t>(draws.size()), [&](uint32_t u) {
      if (failed.load(std::memory_order_relaxed)) return;
      const BatchSeq& s = seqs[draws[u]];
      sample_step_token(s.sampler, s.logits, s.width, s.token_out);
    });
  };
  using Body = decltype(body);
  const unsigned used = WorkerPool::shared().run(
      nt, [](void* ctx, unsigned t, unsigned team) { (*static_cast<Body*>(ctx))(t, team); }, &body);
  if (failed.load(std::memory_order_relaxed)) throw std::bad_alloc();
  return used;
}

}  // namespace kvr::cpu
