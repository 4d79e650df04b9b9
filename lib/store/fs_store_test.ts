// Tests of FsStore: the shared contract, the documented file layout, restarts, TTL on an injected
// clock, LRU budget (also across restarts), temp-file cleanup, corrupt files, and crash safety
// with a real child process SIGKILLed mid-write.

import assert from "node:assert/strict";
import { FS_ENTRY_HEADER_BYTES, FsStore } from "./fs_store.ts";
import { StoreError } from "./store.ts";
import { pattern, storeConformanceTests } from "./conformance_test_helper.ts";

storeConformanceTests("FsStore", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kvr_fs_" });
  const store = await FsStore.open(dir, { sweepIntervalMs: 0 });
  return { store, cleanup: () => Deno.remove(dir, { recursive: true }) };
});

/** Runs `fn` with a fresh temp dir, removed afterwards. */
async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "kvr_fs_" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** All entry (non-temp) and temp file paths under dir. */
async function listFiles(dir: string): Promise<{ entries: string[]; temps: string[] }> {
  const entries: string[] = [];
  const temps: string[] = [];
  for await (const top of Deno.readDir(dir)) {
    if (!top.isDirectory) continue;
    for await (const f of Deno.readDir(`${dir}/${top.name}`)) {
      (f.name.startsWith(".tmp-") ? temps : entries).push(`${dir}/${top.name}/${f.name}`);
    }
  }
  return { entries, temps };
}

/** FNV-1a-32 fan-out, written independently of fs_store.ts from the FNV spec. */
function fnvFan(key: string): string {
  let h = 2166136261n;
  for (const c of new TextEncoder().encode(key)) {
    h ^= BigInt(c);
    h = (h * 16777619n) % 2n ** 32n;
  }
  return (h % 256n).toString(16).padStart(2, "0");
}

Deno.test("`FsStore.put()` writes the documented layout when given a TTL", async () => {
  await withDir(async (dir) => {
    const s = await FsStore.open(dir, { now: () => 1_000, sweepIntervalMs: 0 });
    try {
      await s.put("abc", new Uint8Array([7, 8, 9]), { ttlMs: 500 });
      const path = `${dir}/${fnvFan("abc")}/abc`;
      const raw = await Deno.readFile(path);
      const expiresLe = new Uint8Array(new Float64Array([1_500]).buffer); // host is LE (x86-64)
      assert.deepEqual(
        raw,
        new Uint8Array([
          ...[0x4b, 0x56, 0x52, 0x53, 1, 0, 24, 0], // "KVRS", v1, flags 0, header 24
          ...expiresLe,
          ...[3, 0, 0, 0, 0, 0, 0, 0], // payload length
          7,
          8,
          9,
        ]),
      );
      assert.equal(raw.byteLength, FS_ENTRY_HEADER_BYTES + 3);
      assert.equal((await listFiles(dir)).temps.length, 0);
    } finally {
      await s.close();
    }
  });
});

Deno.test("`FsStore.open()` sees earlier entries when reopened over the same dir", async () => {
  await withDir(async (dir) => {
    const a = await FsStore.open(dir, { sweepIntervalMs: 0 });
    await a.put("k1", pattern(1, 5000));
    await a.put("k2", pattern(2, 10));
    await a.close();
    const b = await FsStore.open(dir, { sweepIntervalMs: 0 });
    try {
      assert.deepEqual(await b.get("k1"), pattern(1, 5000));
      assert.deepEqual(await b.get("k2"), pattern(2, 10));
      assert.equal(b.stats().entries, 2);
      assert.equal(b.stats().bytes, 5010 + 2 * FS_ENTRY_HEADER_BYTES);
    } finally {
      await b.close();
    }
  });
});

Deno.test("`FsStore.get()` returns null once the TTL passes, also across a reopen", async () => {
  await withDir(async (dir) => {
    let now = 1_000_000;
    const clock = () => now;
    const a = await FsStore.open(dir, { now: clock, sweepIntervalMs: 0 });
    await a.put("short", new Uint8Array([1]), { ttlMs: 100 });
    await a.put("long", new Uint8Array([2]), { ttlMs: 10_000 });
    await a.put("forever", new Uint8Array([3]));
    now += 99;
    assert.deepEqual(await a.get("short"), new Uint8Array([1]));
    now += 1; // exactly expiresAt
    assert.equal(await a.get("short"), null);
    assert.equal(await a.has("short"), false);
    assert.equal((await listFiles(dir)).entries.length, 2); // lazily removed from disk
    await a.close();
    now += 10_000; // "long" expired while closed
    const b = await FsStore.open(dir, { now: clock, sweepIntervalMs: 0 });
    try {
      assert.equal(b.stats().expirations, 1); // removed at open
      assert.equal(await b.get("long"), null);
      assert.deepEqual(await b.get("forever"), new Uint8Array([3]));
      await b.put("s2", new Uint8Array([4]), { ttlMs: 5 });
      now += 5;
      assert.equal(await b.sweep(), 1);
      assert.equal(await b.delete("s2"), false);
      assert.deepEqual((await listFiles(dir)).entries, [`${dir}/${fnvFan("forever")}/forever`]);
    } finally {
      await b.close();
    }
  });
});

Deno.test("`FsStore.put()` evicts least-recently-used first, also after a reopen", async () => {
  await withDir(async (dir) => {
    let now = 1_700_000_000_000;
    const clock = () => (now += 1000); // every call is 1 s later: recency is strictly ordered
    const H = FS_ENTRY_HEADER_BYTES;
    const budget = 3 * (H + 100);
    const a = await FsStore.open(dir, { now: clock, maxBytes: budget, sweepIntervalMs: 0 });
    await a.put("a", pattern(1, 100));
    await a.put("b", pattern(2, 100));
    await a.put("c", pattern(3, 100)); // a, b, c: exactly the budget
    assert.ok(await a.get("a")); // b, c, a
    await a.put("d", pattern(4, 100)); // evict b → c, a, d
    assert.equal(await a.has("b"), false);
    assert.equal(a.stats().evictions, 1);
    await a.close();
    // recency comes back from mtimes: c is oldest
    const b = await FsStore.open(dir, { now: clock, maxBytes: budget, sweepIntervalMs: 0 });
    try {
      await b.put("e", pattern(5, 100)); // evict c → a, d, e
      assert.deepEqual(
        await Promise.all(["a", "b", "c", "d", "e"].map((k) => b.has(k))),
        [true, false, false, true, true],
      );
      await b.put("f", pattern(6, 2 * 100 + H)); // needs 2 slots: evict a, d → e, f
      assert.deepEqual(
        await Promise.all(["a", "d", "e", "f"].map((k) => b.has(k))),
        [false, false, true, true],
      );
      assert.equal(b.stats().bytes, budget);
      assert.equal((await listFiles(dir)).entries.length, 2);
      await assert.rejects(
        b.put("huge", new Uint8Array(budget - H + 1)),
        (e) => e instanceof StoreError && e.kind === "too_large",
      );
    } finally {
      await b.close();
    }
  });
  // a smaller budget at open evicts down to it
  await withDir(async (dir) => {
    let now = 1_700_000_000_000;
    const clock = () => (now += 1000);
    const a = await FsStore.open(dir, { now: clock, sweepIntervalMs: 0 });
    for (const k of ["p", "q", "r"]) await a.put(k, new Uint8Array(50));
    await a.close();
    const b = await FsStore.open(dir, { now: clock, maxBytes: 80, sweepIntervalMs: 0 });
    try {
      assert.deepEqual(await Promise.all(["p", "q", "r"].map((k) => b.has(k))), [
        false,
        false,
        true,
      ]);
    } finally {
      await b.close();
    }
  });
});

Deno.test("`FsStore` ends within budget and matches the disk after 100 concurrent puts", async () => {
  await withDir(async (dir) => {
    const H = FS_ENTRY_HEADER_BYTES;
    const budget = 10 * (H + 1000);
    const s = await FsStore.open(dir, { maxBytes: budget, fsync: false, sweepIntervalMs: 0 });
    try {
      await Promise.all(Array.from({ length: 100 }, (_, i) => s.put(`k${i}`, pattern(i, 1000))));
      const { entries, temps } = await listFiles(dir);
      assert.equal(temps.length, 0);
      let onDisk = 0;
      for (const p of entries) {
        onDisk += (await Deno.stat(p)).size;
        const key = p.slice(p.lastIndexOf("/") + 1);
        assert.deepEqual(await s.get(key), pattern(Number(key.slice(1)), 1000), key);
      }
      assert.ok(onDisk <= budget, `${onDisk} bytes on disk > budget ${budget}`);
      assert.ok(entries.length >= 1);
      assert.equal(s.stats().bytes, onDisk);
      assert.equal(s.stats().entries, entries.length);
    } finally {
      await s.close();
    }
  });
});

Deno.test("`FsStore.open()` removes stale temp files and leaves fresh ones by default", async () => {
  await withDir(async (dir) => {
    await Deno.mkdir(`${dir}/3f`, { recursive: true });
    await Deno.writeFile(`${dir}/3f/.tmp-123-old`, new Uint8Array(10));
    await Deno.writeFile(`${dir}/3f/.tmp-456-new`, new Uint8Array(10));
    const hourAgo = new Date(Date.now() - 3600_000);
    await Deno.utime(`${dir}/3f/.tmp-123-old`, hourAgo, hourAgo);
    await Deno.writeFile(`${dir}/README`, new Uint8Array(1)); // foreign: left alone
    const a = await FsStore.open(dir, { sweepIntervalMs: 0 }); // 10 min default
    assert.equal(a.stats().tempFilesRemoved, 1);
    assert.equal(a.stats().foreignFiles, 1);
    assert.deepEqual((await listFiles(dir)).temps, [`${dir}/3f/.tmp-456-new`]);
    await a.close();
    const b = await FsStore.open(dir, { staleTempMs: 0, sweepIntervalMs: 0 });
    await b.close();
    assert.deepEqual((await listFiles(dir)).temps, []);
    assert.ok((await Deno.stat(`${dir}/README`)).isFile);
  });
});

Deno.test("`FsStore.get()` throws StoreError io naming the file when an entry is corrupt", async () => {
  await withDir(async (dir) => {
    const s = await FsStore.open(dir, { sweepIntervalMs: 0 });
    try {
      await s.put("k", pattern(1, 100));
      const path = `${dir}/${fnvFan("k")}/k`;
      await Deno.truncate(path, 50);
      await assert.rejects(
        s.get("k"),
        (e) =>
          e instanceof StoreError && e.kind === "io" && e.message.includes(path) &&
          /payload length 100/.test(e.message),
      );
      await Deno.writeFile(path, new TextEncoder().encode("not an entry at all, no no"));
      await assert.rejects(
        s.get("k"),
        (e) => e instanceof StoreError && /bad magic/.test(e.message),
      );
      assert.equal(await s.delete("k").catch((e) => e.kind), "io");
    } finally {
      await s.close();
    }
  });
});

Deno.test("`FsStore` shows no partial entry when a writer is SIGKILLed mid-write", async () => {
  await withDir(async (dir) => {
    const child = new URL("./testdata/fs_crash_writer.ts", import.meta.url).pathname;
    const sub = `${dir}/${fnvFan("big")}`;
    let sawTemp = false;
    let completed = 0;
    // kill while a temp file exists and (ideally) after ≥ 1 completed write; retry if unlucky
    for (let attempt = 0; attempt < 5 && !sawTemp; attempt++) {
      const proc = new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", child, dir],
        stdout: "piped",
        stderr: "null",
      }).spawn();
      const out = proc.stdout.pipeThrough(new TextDecoderStream());
      const reader = out.getReader();
      try {
        const deadline = Date.now() + 20_000;
        let text = "";
        const readMore = reader.read().then(function pump(r): Promise<void> | void {
          if (r.done) return;
          text += r.value;
          return reader.read().then(pump);
        });
        while (Date.now() < deadline) {
          completed = (text.match(/wrote/g) ?? []).length;
          const temps = await Array.fromAsync(Deno.readDir(sub)).catch(() => []);
          if (completed >= 1 && temps.some((f) => f.name.startsWith(".tmp-"))) {
            proc.kill("SIGKILL");
            break;
          }
          await new Promise((r) => setTimeout(r, 2));
        }
        await proc.status;
        await readMore;
      } finally {
        try {
          proc.kill("SIGKILL");
        } catch { /* already exited */ }
        await proc.status;
        reader.releaseLock();
        await proc.stdout.cancel().catch(() => {});
      }
      sawTemp = (await listFiles(dir)).temps.length > 0;
    }
    assert.ok(sawTemp, "never caught the writer mid-write in 5 attempts");
    assert.ok(completed >= 1);
    // the visible entry is one whole generation: 32 MiB, all bytes equal
    const s = await FsStore.open(dir, { sweepIntervalMs: 0 }); // default: fresh temp stays
    try {
      const got = await s.get("big");
      assert.ok(got !== null, "a completed write must be visible");
      assert.equal(got.byteLength, 32 * 1024 * 1024);
      const first = got[0];
      assert.ok(first >= 1, `generation byte ${first}`);
      assert.ok(got.every((b) => b === first), "entry mixes two generations (torn)");
      assert.equal(s.stats().entries, 1); // the temp file is not an entry
    } finally {
      await s.close();
    }
    const again = await FsStore.open(dir, { staleTempMs: 0, sweepIntervalMs: 0 });
    await again.close();
    assert.equal(again.stats().tempFilesRemoved >= 1, true);
    assert.deepEqual((await listFiles(dir)).temps, []);
  });
});

Deno.test("`FsStore.open()` rejects bad arguments with TypeError/RangeError", async () => {
  // deno-lint-ignore no-explicit-any
  await assert.rejects(FsStore.open("" as any), TypeError);
  await assert.rejects(FsStore.open("/tmp/x", { staleTempMs: -1 }), RangeError);
  await assert.rejects(FsStore.open("/tmp/x", { maxBytes: 0 }), RangeError);
  await assert.rejects(FsStore.open("/tmp/x", { sweepIntervalMs: 1.5 }), RangeError);
});

Deno.test("`FsStore.open()` throws StoreError io when the dir is a file", async () => {
  await withDir(async (dir) => {
    await Deno.writeFile(`${dir}/f`, new Uint8Array(1));
    await assert.rejects(
      FsStore.open(`${dir}/f`),
      (e) => e instanceof StoreError && e.kind === "io" && e.message.includes(`${dir}/f`),
    );
  });
});
