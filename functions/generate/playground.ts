// The browser playground at GET / (the generate function's page, as llama.cpp's server has one):
// three static files from functions/generate/playground/ — no build step, no CDN, nothing loaded
// from elsewhere. The page talks to /v1/models, /v1/chat/completions (SSE) and /metrics; API keys
// apply to those calls as to any client. Read once per process, served with a strict CSP.
import type { Hono } from "hono";

const DIR = new URL("./playground/", import.meta.url);

/** Route → file and media type. */
const FILES: Readonly<Record<string, readonly [string, string]>> = {
  "/": ["index.html", "text/html; charset=utf-8"],
  "/playground/app.js": ["app.js", "text/javascript; charset=utf-8"],
  "/playground/style.css": ["style.css", "text/css; charset=utf-8"],
};

/** Only this origin's script, style and fetches; model text never becomes markup anyway. */
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
  "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/**
 * Registers GET / and the playground's script and stylesheet.
 * @param app the app (from createBaseApp)
 */
export function registerPlayground(app: Hono): void {
  const cache = new Map<string, Uint8Array<ArrayBuffer>>();
  for (const [path, [file, type]] of Object.entries(FILES)) {
    app.get(path, async (c) => {
      let bytes = cache.get(file);
      if (!bytes) {
        bytes = await Deno.readFile(new URL(file, DIR));
        cache.set(file, bytes);
      }
      return c.body(bytes, 200, {
        "content-type": type,
        "content-security-policy": CSP,
        "x-content-type-options": "nosniff",
        "cache-control": "no-cache",
      });
    });
  }
}
