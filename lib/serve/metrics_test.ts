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
