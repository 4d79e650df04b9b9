// Tests of the Prometheus text rendering against hand-written exposition text.
import assert from "node:assert/strict";
import { Counter, Gauge, Histogram, Metrics } from "./metrics.ts";

Deno.test("Counter, Gauge and Histogram render the Prometheus 0.0.4 text format", () => {
  const c = new Counter("x_total", "h");
  c.inc({ b: "2", a: "1" });
  c.inc({ a: "1", b: "2" }, 2);
  assert.deepEqual(c.render(), ['x_total{a="1",b="2"} 3']);
  const g = new Gauge("g", "h");
  g.set({ t: 'q"' }, 4);
  g.add({ t: 'q"' }, -1);
  assert.deepEqual(g.render(), ['g{t="q\\""} 3']);
  const h = new Histogram("lat", "h", [0.1, 1]);
  h.observe({}, 0.05);
  h.observe({}, 0.5);
  h.observe({}, 5);
  assert.deepEqual(h.render(), [
    'lat_bucket{le="0.1"} 1',
    'lat_bucket{le="1"} 2',
    'lat_bucket{le="+Inf"} 3',
    "lat_sum 5.55",
    "lat_count 3",
  ]);
  const m = new Metrics();
  m.requests.inc({ route: "/x", status: "200" });
  const text = m.render();
  assert.match(text, /^# HELP kvrelay_http_requests_total /);
  assert.match(text, /\nkvrelay_http_requests_total\{route="\/x",status="200"\} 1\n/);
  assert.match(text, /# TYPE kvrelay_ttft_seconds histogram/);
});

Deno.test("Metrics renders every family once, counters/gauges/histograms with their buckets", () => {
  const m = new Metrics();
  m.ttft.observe({ tier: "fast" }, 0.02);
  m.tokensPerSecond.observe({ tier: "fast" }, 30);
  m.batchSize.observe({ tier: "fast" }, 3);
  m.queueDepth.set({ tier: "fast" }, 2);
  m.queueDepth.add({ tier: "fast" }, -1);
  m.errors.inc({ type: "x" });
  const text = m.render();
  const families = [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((x) => `${x[1]} ${x[2]}`);
  assert.equal(new Set(families).size, families.length, "each family declared once");
  assert.ok(families.includes("kvrelay_queue_depth gauge"));
  assert.ok(families.includes("kvrelay_errors_total counter"));
  const les = (name: string) =>
    [...text.matchAll(new RegExp(`^${name}_bucket\\{tier="fast",le="([^"]+)"\\} (\\d+)$`, "gm"))]
      .map((x) => `${x[1]}:${x[2]}`).join(" ");
  // The bucket bounds published before the clean-up (docs/http.md, dashboards), written out.
  assert.equal(
    les("kvrelay_ttft_seconds"),
    "0.005:0 0.01:0 0.025:1 0.05:1 0.1:1 0.25:1 0.5:1 1:1 2.5:1 5:1 10:1 +Inf:1",
  );
  assert.equal(
    les("kvrelay_tokens_per_second"),
    "1:0 5:0 10:0 25:0 50:1 100:1 250:1 500:1 1000:1 2500:1 +Inf:1",
  );
  assert.equal(les("kvrelay_batch_size"), "1:0 2:0 4:1 8:1 16:1 32:1 64:1 128:1 +Inf:1");
  assert.match(text, /\nkvrelay_queue_depth\{tier="fast"\} 1\n/);
  assert.match(text, /\nkvrelay_errors_total\{type="x"\} 1\n/);
});
