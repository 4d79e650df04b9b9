// The one shape of a benchmark result file, bench/results/<section>.json: which machine and
// commit, when, and the section's figures as flat rows (labels that say what was measured, a
// median, and the spread over the runs where the section keeps them). Each run of a section
// overwrites its file, so the directory holds the current figures only; git history keeps the
// older ones. bench/report.ts turns the files into bench/RESULTS.md and the plots.
import { type MachineInfo, median } from "./machine.ts";

/** One measured figure. */
export interface ResultRow {
  /** What the figure is of, e.g. `{ model: "tiny-fast", weights: "q8", engine: "kvrelay" }`. */
  labels: Record<string, string | number>;
  /** What was measured, e.g. `prefill128` or `TTFT p99`. */
  metric: string;
  /** e.g. `tokens/s`, `ms`, `MiB`. */
  unit: string;
  /** The median over the runs (the single value where there was one run). */
  median: number;
  /** Smallest and largest run; null where the section records only its median. */
  min: number | null;
  max: number | null;
  /** How many runs the median is of; null where the section does not say. */
  runs: number | null;
}

/** A result file. */
export interface SectionResult {
  section: string;
  machine: { cpu: string; cores: number; os: string; deno: string };
  /** Short hash of the measured code; `+dirty` when the work tree had uncommitted changes. */
  commit: string;
  /** ISO 8601 time of the run. */
  date: string;
  /** The command that produced it. */
  command: string;
  rows: ResultRow[];
}

/**
 * A row; `samples` gives median, min, max and runs at once.
 * @param labels What the figure is of.
 * @param metric What was measured.
 * @param unit Its unit.
 * @param value The median, or every run's value.
 * @returns The row.
 */
export function row(
  labels: Record<string, string | number>,
  metric: string,
  unit: string,
  value: number | number[],
): ResultRow {
  if (typeof value === "number") {
    return { labels, metric, unit, median: value, min: null, max: null, runs: null };
  }
  if (value.length === 0) throw new RangeError(`no samples for ${metric}`);
  return {
    labels,
    metric,
    unit,
    median: median(value),
    min: Math.min(...value),
    max: Math.max(...value),
    runs: value.length,
  };
}

/** The identity of a row: its labels and metric. */
export function rowKey(r: ResultRow): string {
  return JSON.stringify([Object.entries(r.labels), r.metric]);
}

/**
 * Merges several runs of one section into one row set: per row identity, the median of the runs'
 * medians and the smallest and largest of them.
 * @param runs Each run's rows.
 * @returns One row per identity, in first-seen order.
 */
export function combineRuns(runs: ResultRow[][]): ResultRow[] {
  const byKey = new Map<string, ResultRow[]>();
  for (const rows of runs) {
    for (const r of rows) {
      const k = rowKey(r);
      byKey.set(k, [...byKey.get(k) ?? [], r]);
    }
  }
  return [...byKey.values()].map((rs) =>
    rs.length === 1 ? rs[0] : row(rs[0].labels, rs[0].metric, rs[0].unit, rs.map((r) => r.median))
  );
}

/**
 * The short hash of HEAD, with `+dirty` when tracked files outside bench/results differ.
 * @param root The repository root.
 * @returns The commit, or `unknown` outside a git checkout.
 */
export async function currentCommit(root: string): Promise<string> {
  const git = async (...args: string[]) => {
    const out = await new Deno.Command("git", { args: ["-C", root, ...args], stderr: "null" })
      .output().catch(() => null);
    return out?.success ? new TextDecoder().decode(out.stdout).trim() : null;
  };
  const head = await git("rev-parse", "--short", "HEAD");
  if (head === null) return "unknown";
  const dirty = await git(
    "status",
    "--porcelain",
    "--untracked-files=no",
    "--",
    ".",
    ":!bench/results",
  );
  return dirty ? `${head}+dirty` : head;
}

/**
 * The result file of one section run.
 * @param section Section name (the file is bench/results/<section>.json).
 * @param machine What it ran on.
 * @param commit The measured code (currentCommit).
 * @param command The command line.
 * @param rows The figures.
 * @returns The file's content.
 */
export function sectionResult(
  section: string,
  machine: MachineInfo,
  commit: string,
  command: string,
  rows: ResultRow[],
): SectionResult {
  return {
    section,
    machine: {
      cpu: machine.cpuModel,
      cores: machine.logicalCpus,
      os: machine.os,
      deno: machine.deno,
    },
    commit,
    date: machine.date,
    command,
    rows,
  };
}

/**
 * Checks that a parsed file has the result shape.
 * @param x Parsed JSON.
 * @param name Where it came from, for the message.
 * @returns The file, typed.
 * @throws TypeError naming the first field that is wrong.
 */
export function parseSectionResult(x: unknown, name: string): SectionResult {
  const fail = (what: string): never => {
    throw new TypeError(`${name}: ${what}`);
  };
  const o = x as Partial<SectionResult>;
  if (typeof o !== "object" || o === null) fail("not an object");
  for (const k of ["section", "commit", "date", "command"] as const) {
    if (typeof o[k] !== "string") fail(`${k} must be a string`);
  }
  if (typeof o.machine?.cpu !== "string" || typeof o.machine?.cores !== "number") {
    fail("machine must have cpu and cores");
  }
  if (!Array.isArray(o.rows)) fail("rows must be an array");
  o.rows!.forEach((r, i) => {
    if (typeof r.metric !== "string" || typeof r.unit !== "string") {
      fail(`rows[${i}]: metric, unit`);
    }
    if (typeof r.median !== "number" || !Number.isFinite(r.median)) fail(`rows[${i}].median`);
    if (typeof r.labels !== "object" || r.labels === null) fail(`rows[${i}].labels`);
  });
  return o as SectionResult;
}
