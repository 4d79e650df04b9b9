// `deno task results`: bench/RESULTS.md from bench/results/<section>.json (result_file.ts), one
// table per section with its machine, commit and date, and two plots (bench/plots/) drawn here as
// plain SVG: the peer comparison (kvrelay / llama.cpp per model, weights and column) and the
// batching curve (decode tokens/s against concurrent requests). No plotting dependency: a few rects and lines.
import { parseSectionResult, type ResultRow, type SectionResult } from "./result_file.ts";

/** Sections in the order RESULTS.md lists them (others follow alphabetically). */
const ORDER = [
  "peers",
  "engine",
  "batch",
  "http",
  "serve",
  "snapshot",
  "migration",
  "multihost",
  "coldstart",
  "grammar",
];

/** A figure with about three significant digits, without exponent notation for everyday sizes. */
export function fmtNumber(x: number): string {
  const a = Math.abs(x);
  if (a === 0) return "0";
  if (a >= 1000) return Math.round(x).toString();
  if (a >= 0.01) return String(Number(x.toPrecision(3)));
  return x.toExponential(1);
}

const esc = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/\|/g, "\\|");

/**
 * One section's Markdown: a heading, where and when it was measured, and a table per run of rows
 * with the same label names (columns: the labels, then metric, median, spread and runs).
 * @param r The section's file.
 * @returns Markdown.
 */
export function sectionMarkdown(r: SectionResult): string {
  const lines = [
    `## ${r.section}`,
    "",
    `Machine: ${r.machine.cpu}, ${r.machine.cores} logical CPUs (${r.machine.os}, Deno ${r.machine.deno}). ` +
    `Commit \`${r.commit}\`, ${r.date.slice(0, 10)}. Command: \`${r.command}\`.`,
  ];
  let keys = "";
  for (const row of r.rows) {
    const names = Object.keys(row.labels);
    if (names.join("\0") !== keys || lines.length === 3) {
      keys = names.join("\0");
      const header = [...names, "metric", "median", "spread (min–max)", "runs"];
      lines.push("", `| ${header.join(" | ")} |`, `| ${header.map(() => "---").join(" | ")} |`);
    }
    const spread = row.min === null || row.max === null
      ? "—"
      : `${fmtNumber(row.min)}–${fmtNumber(row.max)}`;
    const cells = [
      ...names.map((k) => esc(String(row.labels[k]))),
      `${esc(row.metric)} (${esc(row.unit)})`,
      fmtNumber(row.median),
      spread,
      row.runs === null ? "—" : String(row.runs),
    ];
    lines.push(`| ${cells.join(" | ")} |`);
  }
  return lines.join("\n");
}

/** One bar of the peer plot: kvrelay's median over llama.cpp's best for one model/weights/column. */
export interface PeerBar {
  label: string;
  ratio: number;
}

/**
 * The peer comparison's bars: for each (model, weights, column) measured by both engines,
 * kvrelay's median divided by llama.cpp's best configuration's median.
 * @param peers The peers section's rows.
 * @returns Bars in row order.
 */
export function peerBars(peers: ResultRow[]): PeerBar[] {
  const bars: PeerBar[] = [];
  for (const k of peers.filter((r) => r.labels.engine === "kvrelay")) {
    const llama = peers.find((r) =>
      String(r.labels.engine).startsWith("llama.cpp") && r.metric === k.metric &&
      r.labels.model === k.labels.model && r.labels.weights === k.labels.weights
    );
    if (llama && llama.median > 0) {
      bars.push({
        label: `${k.labels.model} ${k.labels.weights} ${k.metric}`,
        ratio: k.median / llama.median,
      });
    }
  }
  return bars;
}

/**
 * Horizontal bars of kvrelay / llama.cpp on a log2 axis, with the parity line at 1×.
 * @param bars peerBars().
 * @param title Caption (machine and commit).
 * @returns An SVG document.
 */
export function peersSvg(bars: PeerBar[], title: string): string {
  const rowH = 16, left = 260, plotW = 420, top = 40;
  const h = top + bars.length * rowH + 40;
  const logs = bars.map((b) => Math.log2(b.ratio));
  const lo = Math.min(-1, Math.floor(Math.min(...logs, 0)));
  const hi = Math.max(1, Math.ceil(Math.max(...logs, 0)));
  const x = (l: number) => left + ((l - lo) / (hi - lo)) * plotW;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${
      left + plotW + 80
    }" height="${h}" font-family="sans-serif" font-size="11">`,
    `<text x="10" y="16" font-size="13">kvrelay / llama.cpp best (tokens/s ratio, log scale) — ${
      escXml(title)
    }</text>`,
  ];
  for (let t = lo; t <= hi; t++) {
    parts.push(
      `<line x1="${x(t)}" y1="${top - 6}" x2="${x(t)}" y2="${h - 30}" stroke="${
        t === 0 ? "#000" : "#ddd"
      }"/>`,
      `<text x="${x(t)}" y="${h - 16}" text-anchor="middle">${fmtNumber(2 ** t)}×</text>`,
    );
  }
  bars.forEach((b, i) => {
    const y = top + i * rowH;
    const l = Math.log2(b.ratio);
    const x0 = x(Math.min(0, l)), x1 = x(Math.max(0, l));
    parts.push(
      `<text x="${left - 6}" y="${y + 11}" text-anchor="end">${escXml(b.label)}</text>`,
      `<rect class="bar" x="${x0.toFixed(1)}" y="${y + 2}" width="${
        (x1 - x0).toFixed(1)
      }" height="${rowH - 4}" fill="${l >= 0 ? "#4c78a8" : "#e45756"}"/>`,
      `<text x="${(x1 + 4).toFixed(1)}" y="${y + 11}">${fmtNumber(b.ratio)}×</text>`,
    );
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

/** One line of the batching plot. */
export interface Series {
  name: string;
  points: [number, number][];
}

/**
 * The batching curve's lines: decode tokens/s against concurrency, from the batch section (engine
 * level, per model) and the http section (aggregate over the HTTP service, per tier).
 * @param batch The batch section's rows (or none).
 * @param http The http section's rows (or none).
 * @returns One series per model or tier, points sorted by concurrency.
 */
export function batchingSeries(batch: ResultRow[], http: ResultRow[]): Series[] {
  const series = new Map<string, [number, number][]>();
  const add = (name: string, c: number, tps: number) =>
    series.set(name, [...series.get(name) ?? [], [c, tps]]);
  for (const r of batch) {
    if (r.metric === "decode" && r.labels.mode === "batched") {
      add(`${r.labels.model} (engine)`, Number(r.labels.concurrency), r.median);
    }
  }
  for (const r of http) {
    if (r.metric === "aggregate") {
      add(`${r.labels.tier} tier (HTTP)`, Number(r.labels.concurrency), r.median);
    }
  }
  return [...series].map(([name, points]) => ({
    name,
    points: points.sort((a, b) => a[0] - b[0]),
  }));
}

/**
 * Lines with point markers; x is concurrency on a log2 axis, y tokens/s from 0.
 * @param series batchingSeries().
 * @param title Caption (machine and commit).
 * @returns An SVG document.
 */
export function batchingSvg(series: Series[], title: string): string {
  const w = 640, h = 360, left = 60, right = 170, top = 40, bottom = 40;
  const all = series.flatMap((s) => s.points);
  const cMax = Math.max(2, ...all.map((p) => p[0]));
  const yMax = Math.max(1, ...all.map((p) => p[1])) * 1.05;
  const x = (c: number) => left + (Math.log2(c) / Math.log2(cMax)) * (w - left - right);
  const y = (v: number) => h - bottom - (v / yMax) * (h - top - bottom);
  const colors = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6"];
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="sans-serif" font-size="11">`,
    `<text x="10" y="16" font-size="13">decode tokens/s vs concurrent requests — ${
      escXml(title)
    }</text>`,
    `<line x1="${left}" y1="${h - bottom}" x2="${w - right}" y2="${h - bottom}" stroke="#000"/>`,
    `<line x1="${left}" y1="${top}" x2="${left}" y2="${h - bottom}" stroke="#000"/>`,
  ];
  for (let c = 1; c <= cMax; c *= 2) {
    parts.push(
      `<text x="${x(c).toFixed(1)}" y="${h - bottom + 14}" text-anchor="middle">${c}</text>`,
    );
  }
  for (let i = 0; i <= 4; i++) {
    const v = (yMax / 4) * i;
    parts.push(
      `<text x="${left - 4}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${fmtNumber(v)}</text>`,
    );
  }
  series.forEach((s, i) => {
    const color = colors[i % colors.length];
    const pts = s.points.map(([c, v]) => `${x(c).toFixed(1)},${y(v).toFixed(1)}`);
    parts.push(
      `<polyline points="${pts.join(" ")}" fill="none" stroke="${color}" stroke-width="2"/>`,
    );
    for (const [c, v] of s.points) {
      parts.push(
        `<circle class="point" cx="${x(c).toFixed(1)}" cy="${
          y(v).toFixed(1)
        }" r="3" fill="${color}"/>`,
      );
    }
    parts.push(
      `<text x="${w - right + 10}" y="${top + 14 * i + 4}" fill="${color}">${
        escXml(s.name)
      }</text>`,
    );
  });
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

function escXml(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(
    /"/g,
    "&quot;",
  );
}

const caption = (r: SectionResult) => `${r.machine.cpu}, ${r.machine.cores} CPUs, ${r.commit}`;

/**
 * Reads every bench/results/<section>.json in `dir` and writes RESULTS.md and the plots.
 * @param dir The results folder.
 * @param outDir Where RESULTS.md goes; the plots go to its plots/ folder (peers.svg, batching.svg).
 * @returns The paths written.
 */
export async function writeReport(dir: string, outDir: string): Promise<string[]> {
  const results: SectionResult[] = [];
  for await (const e of Deno.readDir(dir)) {
    if (!e.isFile || !e.name.endsWith(".json")) continue;
    const r = parseSectionResult(JSON.parse(await Deno.readTextFile(`${dir}/${e.name}`)), e.name);
    if (`${r.section}.json` !== e.name) throw new TypeError(`${e.name}: section is "${r.section}"`);
    results.push(r);
  }
  const rank = (s: string) => ORDER.includes(s) ? ORDER.indexOf(s) : ORDER.length;
  results.sort((a, b) => rank(a.section) - rank(b.section) || a.section.localeCompare(b.section));
  const get = (s: string) => results.find((r) => r.section === s);
  const written: string[] = [];
  await Deno.mkdir(`${outDir}/plots`, { recursive: true });
  const plots: string[] = [];
  const peers = get("peers");
  if (peers) {
    await Deno.writeTextFile(
      `${outDir}/plots/peers.svg`,
      peersSvg(peerBars(peers.rows), caption(peers)),
    );
    written.push(`${outDir}/plots/peers.svg`);
    plots.push("![kvrelay / llama.cpp](plots/peers.svg)");
  }
  const batch = get("batch"), http = get("http");
  if (batch || http) {
    const series = batchingSeries(batch?.rows ?? [], http?.rows ?? []);
    await Deno.writeTextFile(
      `${outDir}/plots/batching.svg`,
      batchingSvg(series, caption((batch ?? http)!)),
    );
    written.push(`${outDir}/plots/batching.svg`);
    plots.push("![decode tokens/s vs concurrency](plots/batching.svg)");
  }
  const md = [
    "# Benchmark results",
    "",
    "Generated by `deno task results` from `bench/results/<section>.json` (written by",
    "`deno task bench <section>`, one current file per section); do not edit by hand. Each section",
    "names the machine and commit it was measured on (where a run did not record its commit, the",
    "commit that added the result). Spread is the smallest and largest run where the section keeps",
    "its runs (— where it records only the median). What each section measures:",
    "`docs/README.md` lists the docs; `docs/peers.md`, `docs/batching.md` explain the two plots.",
    "",
    ...plots.flatMap((p) => [p, ""]),
    ...results.flatMap((r) => [sectionMarkdown(r), ""]),
  ].join("\n");
  await Deno.writeTextFile(`${outDir}/RESULTS.md`, md);
  written.push(`${outDir}/RESULTS.md`);
  return written;
}

if (import.meta.main) {
  const bench = new URL(".", import.meta.url).pathname.replace(/\/$/, "");
  for (const p of await writeReport(`${bench}/results`, bench)) console.log(`wrote ${p}`);
}
