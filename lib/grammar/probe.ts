// Builds each new grammar first in a separate, replaceable XGrammar instance (probe_worker.ts, a
// Web Worker), so a schema that makes the WebAssembly build abort costs that worker and not the
// server's instance: the failing request gets the engine's message, the worker is terminated,
// and the next probe starts a fresh one. One probe runs at a time.
// Not the compiling against a vocabulary (xgrammar.ts does that, once a probe has passed).

import { Worker } from "node:worker_threads";
import type { ToolCallMode, ToolCallSyntax } from "./tool_tag.ts";

/** What to build: a response_format schema, or the calls of some tools. */
export type ProbeRequest =
  | { kind: "json_schema"; schema: string }
  | {
    kind: "tool_calls";
    /** name and parameters' schema (JSON text) of each tool */
    tools: { name: string; parameters: string }[];
    mode: ToolCallMode;
    parallel: boolean;
    syntax: ToolCallSyntax;
  };

/** The outcome: the grammar to compile (a schema's EBNF, or the tools' structural tag); else the
 *  engine's message and, when one tool's schema failed, its index in the request's tools. */
export type ProbeAnswer =
  | { ok: true; ebnf?: string; structuralTag?: string }
  | { ok: false; detail: string; tool?: number };

/** One probe worker at a time, replaced after any failure. It is a node:worker_threads Worker
 *  so that, idle, it can be unref'd: it never keeps a process alive between probes. */
class GrammarProbe {
  #worker: Worker | null = null;
  #queue: Promise<unknown> = Promise.resolve();
  /** workers started so far (the first, and each replacement) */
  started = 0;

  /**
   * Builds one grammar in the worker (after those already queued).
   * @param req what to build
   * @returns the worker's answer
   */
  probe(req: ProbeRequest): Promise<ProbeAnswer> {
    const run = this.#queue.then(() => this.#run(req));
    this.#queue = run.catch(() => {});
    return run;
  }

  /** Starts the worker if none runs (idle: it keeps no process alive). */
  warm(): void {
    if (this.#worker) return;
    this.#worker = new Worker(new URL("./probe_worker.ts", import.meta.url));
    this.#worker.unref();
    this.started++;
  }

  async #run(req: ProbeRequest): Promise<ProbeAnswer> {
    this.warm();
    const w = this.#worker!;
    w.ref();
    const answer = await new Promise<ProbeAnswer>((resolve) => {
      const done = (a: ProbeAnswer) => {
        w.off("message", done);
        w.off("error", failed);
        w.off("exit", exited);
        resolve(a);
      };
      const failed = (e: Error) =>
        done({ ok: false, detail: `the grammar engine's worker failed: ${e.message}` });
      const exited = (code: number) =>
        done({ ok: false, detail: `the grammar engine's worker exited with code ${code}` });
      w.on("message", done);
      w.on("error", failed);
      w.on("exit", exited);
      w.postMessage(req);
    });
    if (answer.ok) {
      w.unref();
    } else {
      // Its instance may be inconsistent now: the next probe starts a fresh worker.
      this.#worker = null;
      w.terminate().catch(() => {});
    }
    return answer;
  }
}

let shared: GrammarProbe | null = null;

/**
 * Builds a grammar in the probe worker.
 * @param req what to build
 * @returns the worker's answer
 */
export function probeGrammar(req: ProbeRequest): Promise<ProbeAnswer> {
  shared ??= new GrammarProbe();
  return shared.probe(req);
}

/** Starts the probe worker ahead of the first probe, so its start overlaps other work. */
export function warmProbe(): void {
  shared ??= new GrammarProbe();
  shared.warm();
}

/** How many probe workers this process has started (each failure starts a new one). */
export function probeWorkersStarted(): number {
  return shared?.started ?? 0;
}
