// Worker of bench/peers/bandwidth.ts: copies its own pair of buffers `reps` times when told to go
// and reports the seconds it took. One worker per thread measured.

/// <reference lib="deno.worker" />

self.onmessage = (e: MessageEvent<{ bytes: number; reps: number; go?: boolean }>) => {
  const { bytes, reps } = e.data;
  if (!e.data.go) {
    state.src = new Uint8Array(bytes).fill(1); // touch every page before timing
    state.dst = new Uint8Array(bytes);
    state.dst.set(state.src);
    self.postMessage({ ready: true });
    return;
  }
  const t0 = performance.now();
  for (let r = 0; r < reps; r++) state.dst!.set(state.src!);
  self.postMessage({ seconds: (performance.now() - t0) / 1000 });
};

const state: { src?: Uint8Array; dst?: Uint8Array } = {};
