// Tests only: the official `openai` npm client with its fetch routed into the generate function's
// Hono app, so OpenAI semantics are checked by a real client without a socket.
import OpenAI from "openai";
import type { Runtime } from "../../lib/serve/mod.ts";
import { createGenerateApp } from "./app.ts";

/**
 * An `openai` client whose requests the generate app answers in-process.
 * @param rt the runtime the app serves
 * @returns the client (no retries: a test sees the first answer)
 */
export function client(rt: Runtime): OpenAI {
  const app = createGenerateApp(rt);
  return new OpenAI({
    apiKey: "unused",
    baseURL: "http://kvrelay.test/v1",
    maxRetries: 0,
    fetch: (url: string | URL | Request, init?: RequestInit) =>
      Promise.resolve(app.request(String(url), init)),
  });
}
