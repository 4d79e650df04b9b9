// The tokenizer worker: a Web Worker holding its own copy of one tokenizer, so encoding a long
// text runs on another thread and never stalls the server's event loop (health checks, other
// requests). Messages: {init: {json, config}} once, then {id, text, addSpecialTokens} → {id, ids}
// or {id, error}. Built by Tokenizer.encodeAsync; not imported anywhere else.
import { Tokenizer } from "./tokenizer.ts";

/** A request to the worker. */
export type WorkerRequest =
  | { init: { json: Record<string, unknown>; config: Record<string, unknown> } }
  | { id: number; text: string; addSpecialTokens: boolean };

/** An answer from the worker. */
export type WorkerResponse = { id: number; ids: number[] } | { id: number; error: string };

// deno-lint-ignore no-explicit-any
const scope = self as any;
let tokenizer: Promise<Tokenizer> | null = null;

scope.onmessage = async (e: MessageEvent<WorkerRequest>) => {
  const m = e.data;
  if ("init" in m) {
    tokenizer = Tokenizer.fromJson(m.init.json, m.init.config);
    return;
  }
  try {
    const t = await tokenizer!;
    const ids = t.encode(m.text, { addSpecialTokens: m.addSpecialTokens });
    scope.postMessage({ id: m.id, ids } satisfies WorkerResponse);
  } catch (err) {
    scope.postMessage({ id: m.id, error: (err as Error)?.message ?? String(err) });
  }
};
