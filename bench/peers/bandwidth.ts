// Measured memory copy bandwidth (STREAM "copy" convention: bytes read + bytes written per
// second) with 1..n threads, each copying its own 256 MiB buffer (far beyond the caches) by
// TypedArray.set (a memmove). The peer bench divides weight bytes per token by it to get the
// memory-bandwidth floor of decode. Not a kernel benchmark; a machine fact.

/** Copy bandwidth of a number of threads. */
export interface CopyBandwidth {
  threads: number;
  bytesPerThread: number;
  /** (read + written) bytes per second, all threads together, best of `trials` */
  bytesPerSecond: number;
}

/**
 * Measures copy bandwidth with `threads` workers copying concurrently.
 * @param threads concurrent copiers
 * @param bytesPerThread buffer size per thread (default 256 MiB)
 * @param reps copies per trial; @param trials trials (best kept)
 * @returns the bandwidth
 */
export async function copyBandwidth(
  threads: number,
  bytesPerThread = 256 << 20,
  reps = 4,
  trials = 3,
): Promise<CopyBandwidth> {
  const workers = Array.from(
    { length: threads },
    () => new Worker(new URL("./bandwidth_worker.ts", import.meta.url), { type: "module" }),
  );
  const ask = (w: Worker, msg: object) =>
    new Promise<{ seconds?: number }>((resolve, reject) => {
      w.onmessage = (e) => resolve(e.data);
      w.onerror = (e) => reject(new Error(`bandwidth worker: ${e.message}`));
      w.postMessage(msg);
    });
  try {
    await Promise.all(workers.map((w) => ask(w, { bytes: bytesPerThread, reps })));
    let best = 0;
    for (let t = 0; t < trials; t++) {
      const times = await Promise.all(
        workers.map((w) => ask(w, { bytes: bytesPerThread, reps, go: true })),
      );
      const seconds = Math.max(...times.map((x) => x.seconds!));
      best = Math.max(best, (threads * reps * 2 * bytesPerThread) / seconds);
    }
    return { threads, bytesPerThread, bytesPerSecond: best };
  } finally {
    for (const w of workers) w.terminate();
  }
}
