// Tests of block sharing in the paged KV pool (kvr_seq_block_table, kvr_seq_adopt,
// kvr_kv_pool_ref/unref): reference counts keep shared blocks out of the free list, an adopted
// sequence computes what its donor would (bit for bit), writes into a shared block copy it first
// so no holder sees another's tokens, and every bad id or count is refused with nothing changed.

import assert from "node:assert/strict";
import { EngineError, type NativeSequence } from "./mod.ts";
import { NativeModel } from "./mod.ts";
import { checkpoint, DEMO_DIRS, tokens } from "./test_helpers.ts";

/** Every layer's K and V bytes of positions [0, n). */
function kvBytes(seq: NativeSequence, n: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let l = 0; l < seq.model.config.numLayers; l++) {
    const { k, v } = seq.readKv(l, 0, n);
    out.push(k, v);
  }
  return out;
}

const isCode = (name: string) => (e: unknown) => e instanceof EngineError && e.codeName === name;

Deno.test("adopt(): a sequence adopting a donor's blocks prefills its tail exactly as the donor would, taking no block for the shared prefix", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[2]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(32, 16);
  const prefix = tokens(48, vocab, 1), tail = tokens(9, vocab, 2);
  // Oracle: one sequence that runs the same chunks with nothing shared.
  const alone = pool.createSequence(256);
  await alone.prefill(prefix);
  const want = await alone.prefill(tail);
  const wantKv = kvBytes(alone, 57);
  alone.free();

  const donor = pool.createSequence(256);
  await donor.prefill(prefix);
  const before = pool.blocksFree;
  const ids = donor.blockTable();
  assert.equal(ids.length, 3);
  const seq = pool.createSequence(256);
  seq.adopt(ids, 48);
  assert.equal(seq.length, 48);
  assert.deepEqual(seq.blockTable(), ids);
  assert.equal(pool.blocksFree, before, "adopting takes no block");
  const got = await seq.prefill(tail);
  assert.deepEqual(got, want);
  assert.deepEqual(kvBytes(seq, 57), wantKv);
  assert.equal(pool.blocksFree, before - 1, "only the tail's block is new");
  assert.deepEqual(seq.blockTable().slice(0, 3), ids, "full shared blocks are read, never copied");
  // The donor goes; its blocks stay with the adopter.
  donor.free();
  assert.equal(pool.blocksFree, before - 1);
  assert.deepEqual(kvBytes(seq, 57), wantKv);
  seq.free();
  assert.equal(pool.blocksFree, 32);
  pool.free();
});

Deno.test("adopt(): a fork sharing a partial last block copies it on the first write, so neither side sees the other's tokens", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(16, 16);
  const prompt = tokens(20, vocab, 3); // block 1 holds 4 of 16 positions
  const oracle = async (next: number[]) => {
    const s = pool.createSequence(64);
    await s.prefill(prompt);
    for (const t of next) await s.decode(t);
    const kv = kvBytes(s, s.length);
    s.free();
    return kv;
  };
  const wantA = await oracle([5, 6]), wantB = await oracle([7, 8]);

  const a = pool.createSequence(64);
  await a.prefill(prompt);
  const b = pool.createSequence(64);
  b.adopt(a.blockTable(), 20);
  assert.equal(pool.blocksFree, 14);
  await b.decode(7); // writes position 20 of the shared block: B copies it first
  assert.equal(pool.blocksFree, 13, "the shared partial block was copied once");
  assert.equal(a.blockTable()[0], b.blockTable()[0], "the full block stays shared");
  assert.notEqual(a.blockTable()[1], b.blockTable()[1]);
  await a.decode(5); // A now holds its block alone: written in place
  assert.equal(pool.blocksFree, 13);
  await a.decode(6);
  await b.decode(8);
  assert.deepEqual(kvBytes(a, 22), wantA);
  assert.deepEqual(kvBytes(b, 22), wantB);
  a.free();
  b.free();
  assert.equal(pool.blocksFree, 16);
  pool.free();
});

Deno.test("adopt(): truncating into a shared full block and writing there copies it; the other holder's KV is unchanged", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const vocab = model.config.vocabSize;
  const pool = model.createKvPool(16, 16);
  const a = pool.createSequence(64);
  await a.prefill(tokens(32, vocab, 4));
  const wantA = kvBytes(a, 32);
  const b = pool.createSequence(64);
  b.adopt(a.blockTable(), 32);
  b.truncate(24); // keeps both blocks (the second is partly used): no block changes hands
  assert.equal(pool.blocksFree, 14);
  await b.prefill(tokens(8, vocab, 5)); // rewrites positions 24..31 of the shared block
  assert.equal(pool.blocksFree, 13);
  assert.deepEqual(kvBytes(a, 32), wantA);
  // kv_write into a shared block copies as well
  const c = pool.createSequence(64);
  c.adopt(a.blockTable(), 32);
  const { k, v } = b.readKv(0, 0, 1);
  c.writeKv(0, 0, 1, k, v);
  assert.equal(pool.blocksFree, 12);
  assert.deepEqual(kvBytes(a, 32), wantA);
  for (const s of [a, b, c]) s.free();
  assert.equal(pool.blocksFree, 16);
  pool.free();
});

Deno.test("KvPool.ref()/unref(): a referenced block outlives its sequences and returns on the last unref", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(8, 16);
  const a = pool.createSequence(64);
  await a.prefill(tokens(40, model.config.vocabSize, 6));
  const ids = a.blockTable();
  pool.ref(ids.slice(0, 2));
  a.free();
  assert.equal(pool.blocksFree, 6, "the two referenced blocks stay held");
  const b = pool.createSequence(64);
  b.adopt(ids.slice(0, 2), 32); // a cache hit: adopted from references alone
  pool.unref(ids.slice(0, 1));
  assert.equal(pool.blocksFree, 6);
  b.free();
  assert.equal(pool.blocksFree, 7);
  pool.unref(ids.slice(1, 2));
  assert.equal(pool.blocksFree, 8);
  pool.free();
});

Deno.test("KvPool.ref()/unref() and adopt(): bad ids and counts are refused and change nothing", async () => {
  using model = NativeModel.load(await checkpoint(DEMO_DIRS[0]), { threads: 1 });
  const pool = model.createKvPool(8, 16);
  const a = pool.createSequence(64);
  await a.prefill(tokens(20, model.config.vocabSize, 7));
  const ids = a.blockTable(); // 2 blocks, count 1 each
  const free = pool.blocksFree;
  assert.throws(() => pool.ref(Uint32Array.of(ids[0], 8)), isCode("OUT_OF_RANGE"));
  const unheld = [0, 1, 2, 3, 4, 5, 6, 7].find((i) => !ids.includes(i))!;
  assert.throws(() => pool.ref(Uint32Array.of(ids[0], unheld)), isCode("INVALID_ARGUMENT"));
  // two drops of a block holding one reference: refused, and the first drop is undone
  assert.throws(() => pool.unref(Uint32Array.of(ids[0], ids[0])), isCode("INVALID_ARGUMENT"));
  assert.throws(() => pool.unref(Uint32Array.of(ids[1], 99)), isCode("OUT_OF_RANGE"));
  assert.equal(pool.blocksFree, free);
  assert.deepEqual(a.blockTable(), ids);

  const b = pool.createSequence(64);
  assert.throws(() => b.adopt(ids, 33), isCode("INVALID_ARGUMENT")); // 33 tokens need 3 blocks
  assert.throws(() => b.adopt(ids.slice(0, 1), 20), isCode("INVALID_ARGUMENT"));
  assert.throws(() => b.adopt(Uint32Array.of(ids[0], ids[0]), 20), isCode("INVALID_ARGUMENT"));
  assert.throws(() => b.adopt(Uint32Array.of(ids[0], unheld), 20), isCode("INVALID_ARGUMENT"));
  assert.throws(() => b.adopt(Uint32Array.of(ids[0], 1000), 20), isCode("OUT_OF_RANGE"));
  assert.throws(() => b.adopt(ids, 65), RangeError); // past capacity
  assert.equal(b.length, 0);
  assert.equal(b.blocks, 0);
  await b.prefill([1]);
  assert.throws(() => b.adopt(ids, 20), isCode("INVALID_ARGUMENT")); // not empty
  const contiguous = model.createSequence(64);
  assert.throws(() => contiguous.adopt(ids, 20), isCode("INVALID_ARGUMENT"));
  assert.throws(() => contiguous.blockTable(), isCode("INVALID_ARGUMENT"));
  contiguous.free();
  // every count is where it was: freeing the holders frees every block
  a.free();
  b.free();
  assert.equal(pool.blocksFree, 8);
  pool.free();
});
