// The playground's script (no build step, no dependencies): streams chat answers from
// /v1/chat/completions (SSE) on the chosen tier or by automatic routing, shows per answer what
// kvrelay did (tier, route, escalation, migration, reused tokens, TTFT, tokens/s) from the
// `kvrelay` object of the stream, and polls /metrics for each tier. Model text is only ever set
// as textContent, never parsed as HTML.

const $ = (id) => document.getElementById(id);

/** A user id for sticky routing (crypto.randomUUID needs a secure context; this does not). */
function newUserId() {
  const b = crypto.getRandomValues(new Uint8Array(12));
  return `playground-${[...b].map((x) => x.toString(16).padStart(2, "0")).join("")}`;
}

const state = {
  /** OpenAI chat messages of the conversation so far. */
  messages: [],
  user: newUserId(),
  /** Tier names, lowest first (the order of /v1/models). */
  tiers: [],
  /** Aborts the answer being streamed. */
  abort: null,
};

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

function setStatus(text) {
  $("status").textContent = text;
}

async function errorText(res) {
  try {
    const body = await res.json();
    return body?.error?.message ?? `HTTP ${res.status}`;
  } catch {
    return `HTTP ${res.status}`;
  }
}

async function loadTiers() {
  const res = await fetch("/v1/models", { headers: headers() });
  if (!res.ok) {
    setStatus(
      res.status === 401 ? "This server needs an API key: enter it above." : await errorText(res),
    );
    return;
  }
  state.tiers = (await res.json()).data.map((m) => m.id);
  const select = $("tier");
  const chosen = select.value;
  select.replaceChildren(new Option("automatic routing", "auto"));
  for (const t of state.tiers) select.append(new Option(t, t));
  select.value = state.tiers.includes(chosen) ? chosen : "auto";
  setStatus("");
}

function addEntry(role) {
  const li = document.createElement("li");
  li.className = role;
  const text = document.createElement("p");
  text.className = "text";
  li.append(text);
  $("log").append(li);
  return { li, text };
}

function field(meta, name, value, yes = false) {
  const dd = meta.querySelector(`[data-field="${name}"]`);
  dd.textContent = value;
  dd.classList.toggle("yes", yes);
}

/** Fills an answer's fields from the stream's `kvrelay` object (first and finishing chunk). */
function showInfo(meta, k) {
  field(meta, "tier", k.tier);
  field(meta, "route", k.route);
  const prev = k.previous_tier;
  const up = prev !== null && state.tiers.indexOf(k.tier) > state.tiers.indexOf(prev);
  field(meta, "escalation", up ? `${prev} → ${k.tier}` : "none", up);
  const c = k.cache;
  const migration = k.migrated
    ? `migrated from ${c.from_tier}`
    : c.source === "fallback"
    ? `not migrated from ${c.from_tier}: ${c.reason_code ?? c.reason}`
    : c.source === "prefix"
    ? "own prefix cache"
    : "none";
  field(meta, "migration", migration, k.migrated);
  field(meta, "reused", String(c.reused_tokens));
  if (k.ttft_ms !== undefined) field(meta, "ttft", `${k.ttft_ms.toFixed(1)} ms`);
  if (k.tokens_per_second !== undefined) {
    field(meta, "tps", k.tokens_per_second === null ? "—" : k.tokens_per_second.toFixed(1));
  }
}

/** Reads an SSE body, calling onData with each parsed `data:` frame until [DONE]. */
async function readSse(body, onData) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replaceAll("\r", "");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(prompt) {
  const user = addEntry("user");
  user.text.textContent = prompt;
  const answer = addEntry("assistant");
  const meta = $("answer-meta").content.firstElementChild.cloneNode(true);
  answer.li.append(meta);
  const messages = [...state.messages, { role: "user", content: prompt }];
  const tier = $("tier").value;
  const body = {
    model: tier,
    messages,
    stream: true,
    max_tokens: Number($("max-tokens").value) || 48,
    temperature: Number($("temperature").value) || 0,
    user: state.user,
  };
  const ac = new AbortController();
  state.abort = ac;
  $("send").disabled = true;
  $("stop").disabled = false;
  setStatus("…");
  let text = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: ac.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    await readSse(res.body, (msg) => {
      if (msg.error) throw new Error(msg.error.message);
      if (msg.kvrelay) showInfo(meta, msg.kvrelay);
      const delta = msg.choices?.[0]?.delta?.content;
      if (delta) {
        text += delta;
        answer.text.textContent = text;
      }
    });
    state.messages = [...messages, { role: "assistant", content: text }];
    setStatus("");
  } catch (e) {
    answer.li.classList.add("error");
    if (text === "") answer.text.textContent = e.name === "AbortError" ? "(stopped)" : e.message;
    setStatus(e.name === "AbortError" ? "stopped" : `error: ${e.message}`);
  } finally {
    state.abort = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    refreshMetrics();
  }
}

/** Parses Prometheus text into samples {name, labels, value}. */
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const p of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

function sum(samples, name, match) {
  let total = 0;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(match).every(([k, v]) => s.labels[k] === v)) total += s.value;
  }
  return total;
}

async function refreshMetrics() {
  let samples;
  try {
    const res = await fetch("/metrics");
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    samples = parseMetrics(await res.text());
  } catch (e) {
    $("metrics-note").textContent = `metrics unavailable: ${e.message}`;
    return;
  }
  const rows = state.tiers.map((tier) => {
    const t = { tier };
    const mean = (h) => {
      const n = sum(samples, `${h}_count`, t);
      return n > 0 ? sum(samples, `${h}_sum`, t) / n : null;
    };
    const ttft = mean("kvrelay_ttft_seconds");
    const tps = mean("kvrelay_tokens_per_second");
    return [
      tier,
      sum(samples, "kvrelay_active_sequences", t),
      sum(samples, "kvrelay_queue_depth", t),
      sum(samples, "kvrelay_generated_tokens_total", t),
      ttft === null ? "—" : `${(ttft * 1000).toFixed(1)} ms`,
      tps === null ? "—" : tps.toFixed(1),
      sum(samples, "kvrelay_prefix_cache_hits_total", t),
      sum(samples, "kvrelay_migrations_total", { to: tier }),
    ];
  });
  $("metrics").tBodies[0].replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    tr.dataset.tier = cells[0];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = String(c);
      tr.append(td);
    }
    return tr;
  }));
  $("metrics-note").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

$("ask").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const prompt = $("prompt").value.trim();
  if (prompt === "" || state.abort) return;
  $("prompt").value = "";
  send(prompt);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.abort?.abort());
$("new-chat").addEventListener("click", () => {
  state.abort?.abort();
  state.messages = [];
  state.user = newUserId();
  $("log").replaceChildren();
  setStatus("new conversation");
});
$("api-key").addEventListener("change", async () => {
  await loadTiers();
  refreshMetrics();
});

await loadTiers();
await refreshMetrics();
setInterval(refreshMetrics, 2000);
document.body.dataset.ready = "true";
