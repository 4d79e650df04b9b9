// The generate function: POST /v1/generate (the seed's {prompt, user_id} API with routing and
// escalation), OpenAI-compatible POST /v1/completions and /v1/chat/completions (streaming SSE,
// usage, finish_reason) and GET /v1/models (one id per tier), over an injected Runtime.
// Tier choice is lib/router's; admission, caches and decoding are lib/serve's.
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { GenerateOptions, StepLogprobs } from "../../lib/engine/mod.ts";
import type { Conversation, RouteDecision } from "../../lib/router/mod.ts";
import {
  abortError,
  checkContext,
  checkTextBound,
  type Generation,
  InputError,
  messageText,
  promptChars,
  promptIds,
  type PromptInput,
  type RequestContext,
  requireReady,
  requireTier,
  type Runtime,
  type ServedResult,
  startGeneration,
  type Tier,
} from "../../lib/serve/mod.ts";
import {
  createBaseApp,
  deadlineTier,
  errorBody,
  generationOptions,
  keyTenant,
  readJson,
  requestContext,
  samplingFields,
  sseResponse,
} from "../shared/mod.ts";
import {
  chatLogprob,
  chatSchema,
  completionLogprobs,
  completionSchema,
  extraOptions,
  refuseUnsupportedChat,
  refuseUnsupportedCompletion,
} from "./openai.ts";
import { bestOf, choiceCounts, collectAll, forkChoices, interleave } from "./choices.ts";
import { registerPlayground } from "./playground.ts";
import { type StructuredOutput, structuredOutput } from "./structured.ts";
import {
  parseToolOutput,
  resolveTools,
  ToolCallParser,
  type ToolDelta,
  toolGrammar,
} from "./tools.ts";

const generateSchema = z.object({
  prompt: z.string().min(1),
  user_id: z.string().min(1).max(256),
  cache_salt: z.string().min(1).max(256).optional(),
  tier: z.string().min(1).optional(),
  model: z.string().min(1).optional(),
  ...samplingFields,
});

/** The kvrelay extension object attached to responses. */
function kvrelayInfo(gen: Generation, route: RouteDecision) {
  return {
    tier: gen.tier.name,
    model: gen.tier.model.name,
    route: route.reason,
    previous_tier: route.previousTier ?? null,
    migrated: gen.cache.source === "migrated",
    cache: {
      source: gen.cache.source,
      from_tier: gen.cache.fromTier ?? null,
      reason: gen.cache.reason ?? null,
      reason_code: gen.cache.reasonCode ?? null,
      reused_tokens: gen.cache.reusedTokens,
    },
  };
}

/** Time to first token (ms) and decode speed (tokens/s after the first) of a finished answer. */
function speed(r: ServedResult) {
  const after = r.tokenIds.length - 1;
  return {
    ttft_ms: Math.round(r.ttftMs * 1000) / 1000,
    tokens_per_second: after > 0 && r.decodeSeconds > 0
      ? Math.round((after / r.decodeSeconds) * 10) / 10
      : null,
  };
}

function routeText(p: PromptInput): string {
  if (p.text !== undefined) return p.text;
  if (p.messages) {
    return p.messages.map(messageText).join("\n");
  }
  return "";
}

/** A prompt routed to its tier, tokenized and checked against the tier's limits; no slot yet. */
interface Planned {
  tier: Tier;
  route: RouteDecision;
  ids: number[];
  options: Omit<GenerateOptions, "signal">;
  /** response_format json_object / json_schema: each generation gets a matcher of it */
  structured?: StructuredOutput;
}

/**
 * Chooses the tier (explicit model/tier wins, else the router), tokenizes the prompt and checks
 * it and the sampling fields against that tier — every input error surfaces here, before any
 * generation of the request runs.
 * @throws {NotFoundError} unknown model; {@link InputError} bad prompt/limits;
 *   {@link UnavailableError} not ready
 */
async function plan(
  rt: Runtime,
  req: {
    explicit?: string;
    param: string;
    prompt: PromptInput;
    /** The prompt's field in the request, e.g. "prompt" or "prompt.2". */
    promptParam: string;
    /** The (tenant, user) whose sticky tier applies, when the request names a user. */
    conversation?: Conversation;
    sampling: Parameters<typeof generationOptions>[1];
    /** The field `sampling.max_tokens` came from (default "max_tokens"). */
    maxTokensParam?: string;
    /** More engine options for the chosen tier (bias, penalties, logprobs). */
    extras?: (tier: Tier) => Partial<GenerateOptions>;
  },
): Promise<Planned> {
  requireReady(rt);
  const explicit = req.explicit === "auto" ? undefined : req.explicit;
  let route: RouteDecision;
  let tier: Tier;
  if (explicit !== undefined) {
    tier = requireTier(rt, explicit, req.param);
    route = rt.router.route({
      prompt: "",
      promptTokens: 0,
      explicit,
      conversation: req.conversation,
    });
  } else {
    const first = rt.tiers.get(rt.config.defaultTier)!;
    const text = routeText(req.prompt);
    let n = req.prompt.ids?.length ?? 0;
    if (req.prompt.ids === undefined) {
      checkTextBound(first, promptChars(req.prompt), req.promptParam);
      n = (await first.model.tokenizer.encodeAsync(text)).length;
    }
    route = rt.router.route({ prompt: text, promptTokens: n, conversation: req.conversation });
    tier = requireTier(rt, route.tier, req.param);
  }
  const ids = await promptIds(tier, req.prompt, req.promptParam);
  const options = {
    ...generationOptions(tier, req.sampling, req.maxTokensParam),
    ...req.extras?.(tier),
  };
  checkContext(
    tier,
    ids.length,
    options.maxTokens ?? tier.config.default_max_tokens,
    req.promptParam,
    req.maxTokensParam,
  );
  return { tier, route, ids, options };
}

/** The conversation a request's user id names: user ids are scoped by the API key's tenant. */
function conversationOf(c: Context, user: string | undefined): Conversation | undefined {
  return user === undefined ? undefined : { tenant: keyTenant(c), user };
}

/**
 * Admits a planned generation (queue slot, prefill) and records the user's tier.
 * @throws {QueueFullError}; {@link UnavailableError} timeout/not ready
 */
async function admit(
  rt: Runtime,
  ctx: RequestContext,
  p: Planned,
  conversation: Conversation | undefined,
): Promise<{ gen: Generation; route: RouteDecision }> {
  const grammar = p.structured ? await p.structured.matcher() : undefined;
  let gen: Generation;
  try {
    gen = await startGeneration(rt, {
      tier: p.tier,
      promptIds: p.ids,
      options: grammar ? { ...p.options, grammar } : p.options,
      ctx,
    });
  } catch (e) {
    grammar?.dispose(); // the generation owns it from here (its decode loop or close() frees it)
    throw e;
  }
  rt.router.commit(conversation, p.tier.name);
  return { gen, route: p.route };
}

/** OpenAI finish_reason of an engine result. */
function finishReason(r: ServedResult): "stop" | "length" {
  return r.finishReason === "stop" ? "stop" : "length";
}

function usage(promptTokens: number, completion: number) {
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completion,
    total_tokens: promptTokens + completion,
  };
}

/** The request context with a client signal that also fires when the SSE body is cancelled. */
function linkedContext(
  c: Context,
  cacheSalt: string | null | undefined,
): { ctx: RequestContext; abort: () => void } {
  const ac = new AbortController();
  return {
    ctx: requestContext(c, { signal: AbortSignal.any([c.req.raw.signal, ac.signal]), cacheSalt }),
    abort: () => ac.abort(),
  };
}

/**
 * Registers the generate function's routes on an app.
 * @param app the app (from createBaseApp)
 * @param rt the runtime
 */
export function registerGenerate(app: Hono, rt: Runtime): void {
  registerPlayground(app);
  app.get("/v1/models", (c) => {
    requireReady(rt);
    return c.json({
      object: "list",
      data: [...rt.tiers.values()].map((t) => ({
        id: t.name,
        object: "model",
        created: 0,
        owned_by: "kvrelay",
        root: t.model.name,
        max_context: t.config.max_context,
      })),
    });
  });

  app.post("/v1/generate", async (c) => {
    const body = generateSchema.parse(await readJson(c, rt));
    const requestId = `gen-${crypto.randomUUID()}`;
    const planned = await plan(rt, {
      explicit: body.tier ?? body.model,
      param: body.tier !== undefined ? "tier" : "model",
      prompt: { text: body.prompt },
      promptParam: "prompt",
      conversation: conversationOf(c, body.user_id),
      sampling: body,
    });
    deadlineTier(c, planned.tier);
    const { gen, route } = await admit(
      rt,
      requestContext(c, { cacheSalt: body.cache_salt }),
      planned,
      conversationOf(c, body.user_id),
    );
    const info = kvrelayInfo(gen, route);
    const r = await gen.collect();
    return c.json({
      response: r.text,
      request_id: requestId,
      tier: info.tier,
      migrated: info.migrated,
      cache: info.cache,
      route: info.route,
      previous_tier: info.previous_tier,
      ...speed(r),
      tokens: r.tokenIds.length,
      prompt_tokens: r.promptTokens,
      finish_reason: finishReason(r),
    });
  });

  app.post("/v1/completions", async (c) => {
    const body = completionSchema.parse(await readJson(c, rt));
    refuseUnsupportedCompletion(body);
    const { n, candidates } = choiceCounts(body.n, body.best_of, body.stream === true);
    const prompts: PromptInput[] = typeof body.prompt === "string"
      ? [{ text: body.prompt }]
      : typeof body.prompt[0] === "string"
      ? (body.prompt as string[]).map((text) => ({ text }))
      : typeof body.prompt[0] === "number"
      ? [{ ids: body.prompt as number[] }]
      : (body.prompt as number[][]).map((ids) => ({ ids }));
    const id = `cmpl-${crypto.randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const logprobs = body.logprobs ?? undefined;
    // Every prompt is checked before the first one runs: a bad prompt 2 is a 400, not an error
    // after prompt 1's text (or inside a 200 stream).
    const plans: Planned[] = [];
    for (const [i, prompt] of prompts.entries()) {
      plans.push(
        await plan(rt, {
          explicit: body.model,
          param: "model",
          prompt,
          promptParam: typeof body.prompt === "string" || typeof body.prompt[0] === "number"
            ? "prompt"
            : `prompt.${i}`,
          conversation: conversationOf(c, body.user),
          sampling: body,
          // best_of ranks candidates by their tokens' logprobs, asked for or not.
          extras: (tier) => extraOptions(tier, body, logprobs ?? (candidates > n ? 0 : undefined)),
        }),
      );
      const last = plans[plans.length - 1];
      last.structured = await structuredOutput(last.tier, body.response_format);
    }
    for (const p of plans) deadlineTier(c, p.tier);
    const link = linkedContext(c, body.cache_salt);
    // Each prompt's choices fork its prefilled KV; choice j of prompt i is index i·n + j.
    const admitOne = async (i: number) => {
      const a = await admit(rt, link.ctx, plans[i], conversationOf(c, body.user));
      return {
        ...a,
        gens: await forkChoices(
          a.gen,
          candidates,
          plans[i].structured,
          candidates > n ? "best_of" : "n",
        ),
      };
    };
    if (!body.stream) {
      const choices = [];
      let promptTokens = 0;
      let completion = 0;
      let model = "";
      let info: ReturnType<typeof kvrelayInfo> | undefined;
      for (let i = 0; i < prompts.length; i++) {
        const { gen, route, gens } = await admitOne(i);
        info ??= kvrelayInfo(gen, route);
        model = gen.tier.name;
        const rs = await collectAll(gens);
        promptTokens += rs[0].promptTokens;
        // Every candidate's tokens count, the ones best_of drops too: they were generated.
        for (const r of rs) completion += r.tokenIds.length;
        const keep = candidates > n ? bestOf(rs, n) : rs.map((_, j) => j);
        for (const [j, k] of keep.entries()) {
          const r = rs[k];
          choices.push({
            index: i * n + j,
            text: r.text,
            finish_reason: finishReason(r),
            logprobs: logprobs === undefined
              ? null
              : completionLogprobs(gen.tier, r.logprobs ?? []),
          });
        }
      }
      return c.json({
        id,
        object: "text_completion",
        created,
        model,
        choices,
        usage: usage(promptTokens, completion),
        kvrelay: info,
      });
    }
    const includeUsage = body.stream_options?.include_usage === true;
    const first = await admitOne(0);
    return sseResponse(
      c,
      async (send) => {
        let promptTokens = 0;
        let completion = 0;
        for (let i = 0; i < prompts.length; i++) {
          const { gen, gens } = i === 0 ? first : await admitOne(i);
          const model = gen.tier.name;
          const offsets = gens.map(() => 0);
          const frame = (j: number, text: string, fr: string | null, lp?: StepLogprobs) => {
            const f = {
              id,
              object: "text_completion",
              created,
              model,
              choices: [{
                index: i * n + j,
                text,
                finish_reason: fr,
                logprobs: lp ? completionLogprobs(gen.tier, [lp], offsets[j]) : null,
              }],
              ...(includeUsage ? { usage: null } : {}),
            };
            offsets[j] += text.length;
            return f;
          };
          promptTokens += gen.promptIds.length;
          for await (const ev of interleave(gens)) {
            if (ev.done) {
              if (ev.result.abortCause) throw abortError(ev.result, gens[ev.choice]);
              completion += ev.result.tokenIds.length;
              send(frame(ev.choice, "", finishReason(ev.result)));
            } else if (ev.chunk.text !== "" || ev.chunk.logprobs) {
              send(frame(ev.choice, ev.chunk.text, null, ev.chunk.logprobs));
            }
          }
        }
        if (includeUsage) {
          send({
            id,
            object: "text_completion",
            created,
            model: first.gen.tier.name,
            choices: [],
            usage: usage(promptTokens, completion),
          });
        }
      },
      link.abort,
      (e) => errorBody(e, c.get("requestId")).body,
    );
  });

  app.post("/v1/chat/completions", async (c) => {
    const body = chatSchema.parse(await readJson(c, rt));
    refuseUnsupportedChat(body);
    const { n } = choiceCounts(body.n, undefined, body.stream === true);
    const id = `chatcmpl-${crypto.randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const logprobs = body.logprobs === true ? body.top_logprobs ?? 0 : undefined;
    const tools = resolveTools(body.tools, body.tool_choice, body.parallel_tool_calls);
    if (tools?.forced && body.response_format != null && body.response_format.type !== "text") {
      throw new InputError(
        "response_format cannot be combined with tool_choice required or a named function",
        "response_format",
      );
    }
    const planned = await plan(rt, {
      explicit: body.model,
      param: "model",
      prompt: { messages: body.messages, tools: tools?.rendered },
      promptParam: "messages",
      conversation: conversationOf(c, body.user),
      sampling: { ...body, max_tokens: body.max_completion_tokens ?? body.max_tokens },
      maxTokensParam: body.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens",
      extras: (tier) => extraOptions(tier, body, logprobs),
    });
    // With auto, a response_format other than text takes precedence over the tools' grammar.
    const formatGrammar = await structuredOutput(planned.tier, body.response_format);
    const callGrammar = formatGrammar ? undefined : await toolGrammar(planned.tier, tools);
    planned.structured = formatGrammar ?? callGrammar;
    deadlineTier(c, planned.tier);
    const link = linkedContext(c, body.cache_salt);
    const { gen, route } = await admit(rt, link.ctx, planned, conversationOf(c, body.user));
    // OpenAI's finish_reason for an output that ends in calls.
    const chatFinish = (r: ServedResult, calls: number) =>
      calls > 0 && r.finishReason === "stop" ? "tool_calls" : finishReason(r);
    const gens = await forkChoices(gen, n, planned.structured);
    const model = gen.tier.name;
    const info = kvrelayInfo(gen, route);
    const lpObject = (steps: StepLogprobs[] | undefined) =>
      logprobs === undefined
        ? null
        : { content: (steps ?? []).map((s) => chatLogprob(gen.tier, s)), refusal: null };
    if (!body.stream) {
      const rs = await collectAll(gens);
      return c.json({
        id,
        object: "chat.completion",
        created,
        model,
        choices: rs.map((r, index) => {
          const message = tools ? parseToolOutput(tools, r.text) : { content: r.text };
          return {
            index,
            message: { role: "assistant", ...message, refusal: null },
            finish_reason: chatFinish(r, message.tool_calls?.length ?? 0),
            logprobs: lpObject(r.logprobs),
          };
        }),
        usage: usage(rs[0].promptTokens, rs.reduce((t, r) => t + r.tokenIds.length, 0)),
        kvrelay: info,
      });
    }
    const includeUsage = body.stream_options?.include_usage === true;
    return sseResponse(c, async (send) => {
      const frame = (
        index: number,
        delta: Record<string, unknown>,
        fr: string | null,
        lp?: StepLogprobs,
      ) => ({
        id,
        object: "chat.completion.chunk",
        created,
        model,
        choices: [{ index, delta, finish_reason: fr, logprobs: lp ? lpObject([lp]) : null }],
        ...(includeUsage ? { usage: null } : {}),
      });
      // kvrelay's extension rides on each choice's first chunk (tier, route, cache) and its
      // finishing one (plus speed); OpenAI clients ignore the field.
      const opening = tools?.forced ? { role: "assistant", content: null } : {
        role: "assistant",
        content: "",
      };
      for (let j = 0; j < gens.length; j++) {
        send({ ...frame(j, opening, null), kvrelay: info });
      }
      // With tools, each choice's text goes through its own parser: content and tool_calls deltas.
      const parsers = gens.map(() =>
        tools ? new ToolCallParser(tools, callGrammar !== undefined) : undefined
      );
      const sendDeltas = (j: number, deltas: ToolDelta[], lp?: StepLogprobs) => {
        if (deltas.length === 0 && lp) send(frame(j, {}, null, lp));
        deltas.forEach((d, i) => send(frame(j, d, null, i === 0 ? lp : undefined)));
      };
      let completion = 0;
      for await (const ev of interleave(gens)) {
        const parser = parsers[ev.choice];
        if (ev.done) {
          const r = ev.result;
          if (r.abortCause) throw abortError(r, gens[ev.choice]);
          completion += r.tokenIds.length;
          if (parser) sendDeltas(ev.choice, parser.end());
          send({
            ...frame(ev.choice, {}, chatFinish(r, parser?.calls.length ?? 0)),
            kvrelay: { ...info, ...speed(r) },
          });
        } else if (parser) {
          sendDeltas(ev.choice, parser.push(ev.chunk.text), ev.chunk.logprobs);
        } else if (ev.chunk.text !== "" || ev.chunk.logprobs) {
          send(frame(ev.choice, { content: ev.chunk.text }, null, ev.chunk.logprobs));
        }
      }
      if (includeUsage) {
        send({
          id,
          object: "chat.completion.chunk",
          created,
          model,
          choices: [],
          usage: usage(gen.promptIds.length, completion),
        });
      }
    }, () => {
      link.abort();
    }, (e) => errorBody(e, c.get("requestId")).body);
  });
}

/**
 * Builds the generate function's app alone (probes + generate routes).
 * @param rt the runtime (tiers loaded or loading)
 * @returns the Hono app
 */
export function createGenerateApp(rt: Runtime): Hono {
  const app = createBaseApp(rt, "generate");
  registerGenerate(app, rt);
  return app;
}
