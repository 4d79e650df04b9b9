// A one-line progress bar with ETA on stderr, redrawn in place, for the long-running migration
// commands (fit, eval-migration). Writes nothing to stdout; knows nothing about what it counts.

/**
 * Makes a progress reporter: each call redraws `label phase [####    ] done/total pct elapsed ETA`
 * on stderr, ending the line when done >= total. Each phase keeps its own start time. When stderr
 * is not a terminal, only one line per phase, when it ends.
 *
 * @param label prefix of every line, e.g. "fit tiny-fast→tiny-balanced"
 * @param terminal redraw in place (default: whether stderr is a terminal)
 * @returns (phase, done, total) → void, with done and total in the caller's units
 */
export function progressBar(
  label: string,
  terminal: boolean = Deno.stderr.isTerminal(),
): (phase: string, done: number, total: number) => void {
  const start = new Map<string, number>();
  const ended = new Set<string>();
  const enc = new TextEncoder();
  return (phase, done, total) => {
    const now = performance.now();
    if (!start.has(phase)) start.set(phase, now);
    const t0 = start.get(phase)!;
    const frac = total > 0 ? done / total : 1;
    const width = 30, filled = Math.round(frac * width);
    const elapsed = (now - t0) / 1000;
    const eta = done > 0 ? (elapsed / done) * (total - done) : NaN;
    const line =
      `\r${label} ${phase} [${"#".repeat(filled)}${" ".repeat(width - filled)}] ${done}/${total} ` +
      `${(frac * 100).toFixed(0)}% ${elapsed.toFixed(0)}s ETA ${
        Number.isFinite(eta) ? eta.toFixed(0) + "s" : "?"
      }   `;
    if (terminal) Deno.stderr.writeSync(enc.encode(line + (done >= total ? "\n" : "")));
    else if (done >= total && !ended.has(phase)) {
      // Not a terminal (a CI log, a file): no redraws, one line when a phase ends.
      ended.add(phase);
      Deno.stderr.writeSync(
        enc.encode(`${label} ${phase} ${done}/${total} in ${elapsed.toFixed(0)}s\n`),
      );
    }
  };
}
