// Child process for FsStore's crash-safety test: overwrites key "big" forever with 32 MiB values
// whose every byte is the generation number (1, 2, 3, ... mod 256), until the parent SIGKILLs it.
// Not a test itself. Usage: deno run -A fs_crash_writer.ts <dir>

import { FsStore } from "../fs_store.ts";

const dir = Deno.args[0];
const store = await FsStore.open(dir, { sweepIntervalMs: 0 });
const bytes = 32 * 1024 * 1024;
for (let gen = 1;; gen++) {
  await store.put("big", new Uint8Array(bytes).fill(gen & 255));
  console.log(`wrote ${gen}`);
}
