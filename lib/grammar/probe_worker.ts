// The probe worker: a worker thread with its own XGrammar instance that converts each new schema
// to EBNF (ebnf_fix.ts applied) and builds the grammar once, without a vocabulary, before the
// server's instance compiles that EBNF. XGrammar's WebAssembly
// build reports some bad schemas by aborting, which can leave its instance inconsistent; here
// that costs only this worker, which the server then replaces (probe.ts). Messages: a
// ProbeRequest → a ProbeAnswer. Started by probe.ts; not imported anywhere else.
import { parentPort } from "node:worker_threads";
import { captureFailure, loadXGrammar, XGrammarFailure } from "./load.ts";
import { toolCallTag } from "./tool_tag.ts";
import { fixJsonStrings } from "./ebnf_fix.ts";
import type { ProbeAnswer, ProbeRequest } from "./probe.ts";

const xg = loadXGrammar(0);

async function probe(req: ProbeRequest): Promise<ProbeAnswer> {
  const x = await xg;
  if (req.kind === "json_schema") {
    // Strict: no properties beyond the schema's, compact separators (no whitespace runs).
    const ebnf = fixJsonStrings(
      await captureFailure(() =>
        x.Testings._jsonSchemaToEBNF(req.schema, false, -1, [",", ":"], true)
      ),
    );
    (await captureFailure(() => x.Grammar.fromEBNF(ebnf))).dispose();
    return { ok: true, ebnf };
  }
  const tools: { name: string; ebnf: string }[] = [];
  for (const [i, t] of req.tools.entries()) {
    try {
      const ebnf = await captureFailure(() =>
        x.Testings._jsonSchemaToEBNF(t.parameters, false, -1, [", ", ": "], true)
      );
      tools.push({ name: t.name, ebnf: fixJsonStrings(ebnf) });
    } catch (e) {
      return { ok: false, detail: (e as Error).message, tool: i };
    }
  }
  const tag = toolCallTag(tools, req.mode, req.parallel, req.syntax);
  (await captureFailure(() => x.Grammar.fromStructuralTag(tag))).dispose();
  return { ok: true, structuralTag: tag };
}

parentPort!.on("message", async (req: ProbeRequest) => {
  let answer: ProbeAnswer;
  try {
    answer = await probe(req);
  } catch (err) {
    answer = {
      ok: false,
      detail: err instanceof XGrammarFailure ? err.detail : String((err as Error)?.message ?? err),
    };
  }
  parentPort!.postMessage(answer);
});
