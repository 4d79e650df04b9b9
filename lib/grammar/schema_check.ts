// Checks a response_format or tool JSON schema before XGrammar sees it, naming the path of the
// first construct it cannot compile or would get wrong (keywords it ignores, bounds it enforces
// loosely). Its own errors name no path, and its WebAssembly build reports many by aborting; what
// gets past this check is built in a replaceable worker first (probe.ts). The rules are XGrammar's
// JSON-schema converter's (its supported keywords; a local $ref only; regex patterns without
// lookaround or backreferences).

/** A response_format the engine cannot use, with the request field it names. */
export class GrammarInputError extends RangeError {
  /** the request field, e.g. "response_format.json_schema.schema.properties.age.type" */
  readonly param: string;
  /**
   * @param message what is wrong (names the field)
   * @param param the request field
   */
  constructor(message: string, param: string) {
    super(message);
    this.name = "GrammarInputError";
    this.param = param;
  }
}

const TYPES = new Set(["object", "array", "string", "number", "integer", "boolean", "null"]);
/** keywords holding one subschema */
const ONE = ["items", "additionalProperties", "unevaluatedProperties", "additionalItems"];
/** keywords holding a list of subschemas */
const LIST = ["anyOf", "oneOf", "allOf", "prefixItems"];
/** keywords holding a map of subschemas */
const MAP = ["properties", "$defs", "definitions"];
/** keywords XGrammar's converter does not implement: refused rather than silently ignored */
const UNSUPPORTED = [
  "not",
  "if",
  "then",
  "else",
  "contains",
  "dependentSchemas",
  "patternProperties",
];
const COUNTS = [
  "minItems",
  "maxItems",
  "minLength",
  "maxLength",
  "minProperties",
  "maxProperties",
];
const BOUNDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
/** Deepest nesting accepted (the converter recurses per level). */
const MAX_DEPTH = 64;

/**
 * Checks a JSON schema for XGrammar.
 *
 * @param schema the parsed schema
 * @param param the request field holding it (prefix of every reported path)
 * @throws {GrammarInputError} naming the first unsupported or malformed construct
 */
export function checkSchema(schema: unknown, param: string): void {
  walk(schema, schema, param, 0);
}

function fail(path: string, message: string): never {
  throw new GrammarInputError(`${path}: ${message}`, path);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function walk(root: unknown, s: unknown, path: string, depth: number): void {
  if (typeof s === "boolean") return;
  if (!isObject(s)) fail(path, "a schema must be an object or a boolean");
  if (depth > MAX_DEPTH) fail(path, `schemas nest deeper than ${MAX_DEPTH} levels`);
  for (const k of UNSUPPORTED) {
    if (k in s) fail(`${path}.${k}`, `the keyword "${k}" is not supported for structured output`);
  }
  if ("type" in s) {
    const t = s.type;
    const list = Array.isArray(t) ? t : [t];
    if (list.length === 0) fail(`${path}.type`, "type must not be an empty list");
    list.forEach((x, i) => {
      if (typeof x !== "string" || !TYPES.has(x)) {
        fail(
          Array.isArray(t) ? `${path}.type[${i}]` : `${path}.type`,
          `unsupported type ${JSON.stringify(x)} (one of ${[...TYPES].join(", ")})`,
        );
      }
    });
  }
  if ("$ref" in s) {
    const ref = s.$ref;
    if (typeof ref !== "string" || !resolves(root, ref)) {
      fail(`${path}.$ref`, `${JSON.stringify(ref)} does not name a definition in this schema`);
    }
  }
  if ("pattern" in s) checkPattern(s.pattern, `${path}.pattern`);
  if ("required" in s) {
    if (!Array.isArray(s.required) || s.required.some((x) => typeof x !== "string")) {
      fail(`${path}.required`, "required must be a list of property names");
    }
  }
  if ("enum" in s && (!Array.isArray(s.enum) || s.enum.length === 0)) {
    fail(`${path}.enum`, "enum must be a non-empty list");
  }
  // The engine matches a fractional number in enum/const loosely (outputs outside the list).
  const fractional = (v: unknown) => typeof v === "number" && !Number.isInteger(v);
  if (Array.isArray(s.enum) && s.enum.some(fractional)) {
    fail(`${path}.enum`, "fractional numbers in enum are not supported for structured output");
  }
  if (fractional(s.const)) {
    fail(`${path}.const`, "a fractional number as const is not supported for structured output");
  }
  for (const k of COUNTS) {
    if (k in s && !(Number.isSafeInteger(s[k]) && (s[k] as number) >= 0)) {
      fail(`${path}.${k}`, `${k} must be an integer >= 0`);
    }
  }
  for (
    const [lo, hi] of [["minItems", "maxItems"], ["minLength", "maxLength"], [
      "minProperties",
      "maxProperties",
    ]]
  ) {
    if (lo in s && hi in s && (s[lo] as number) > (s[hi] as number)) {
      fail(`${path}.${lo}`, `${lo} ${s[lo]} exceeds ${hi} ${s[hi]}`);
    }
  }
  for (const k of BOUNDS) {
    if (k in s && !(typeof s[k] === "number" && Number.isFinite(s[k]))) {
      fail(`${path}.${k}`, `${k} must be a finite number`);
    }
  }
  // The engine enforces minimum/maximum on integers only; a bound it would ignore is refused
  // rather than answered with output outside it (exclusive bounds and multipleOf likewise).
  for (const k of ["exclusiveMinimum", "exclusiveMaximum", "multipleOf"]) {
    if (k in s) fail(`${path}.${k}`, `${k} is not supported for structured output`);
  }
  // Its integer ranges are exact only at 0 and ±(10^k − 1) (a bound like 180 lets 181..189
  // through): other bounds are refused for the same reason.
  for (const k of ["minimum", "maximum"]) {
    if (!(k in s)) continue;
    if (s.type !== "integer") fail(`${path}.${k}`, `${k} is supported on "type": "integer" only`);
    const v = s[k];
    if (typeof v === "number" && !(v === 0 || /^-?9+$/.test(String(v)))) {
      fail(`${path}.${k}`, `${k} must be 0 or ±(10^k − 1) (9, 99, 999, ...), got ${v}`);
    }
  }
  if (
    typeof s.minimum === "number" && typeof s.maximum === "number" && s.minimum > s.maximum
  ) {
    fail(`${path}.minimum`, `minimum ${s.minimum} exceeds maximum ${s.maximum}`);
  }
  if ("format" in s && typeof s.format !== "string") {
    fail(`${path}.format`, "format must be a string");
  }
  for (const k of ONE) if (k in s) walk(root, s[k], `${path}.${k}`, depth + 1);
  for (const k of LIST) {
    if (!(k in s)) continue;
    const list = s[k];
    if (!Array.isArray(list) || list.length === 0) {
      fail(`${path}.${k}`, `${k} must be a non-empty list`);
    }
    list.forEach((x, i) => walk(root, x, `${path}.${k}[${i}]`, depth + 1));
  }
  for (const k of MAP) {
    if (!(k in s)) continue;
    const map = s[k];
    if (!isObject(map)) fail(`${path}.${k}`, `${k} must be an object`);
    for (const [name, sub] of Object.entries(map)) {
      walk(
        root,
        sub,
        `${path}.${k}${/^[A-Za-z_$][\w$]*$/.test(name) ? `.${name}` : `[${JSON.stringify(name)}]`}`,
        depth + 1,
      );
    }
  }
}

/** Whether ref is "#" or a "#/a/b" JSON pointer into root (the only references XGrammar follows). */
function resolves(root: unknown, ref: string): boolean {
  if (ref === "#") return true;
  if (!ref.startsWith("#/")) return false;
  let cur: unknown = root;
  for (const raw of ref.slice(2).split("/")) {
    const part = decodeURIComponent(raw).replaceAll("~1", "/").replaceAll("~0", "~");
    if (!isObject(cur) || !Object.hasOwn(cur, part)) return false;
    cur = cur[part];
  }
  return isObject(cur) || typeof cur === "boolean";
}

function checkPattern(p: unknown, path: string): void {
  if (typeof p !== "string") fail(path, "pattern must be a string");
  try {
    new RegExp(p, "u");
  } catch (e) {
    fail(path, `not a valid regular expression: ${(e as Error).message}`);
  }
  // Lookaround, backreferences and named groups: beyond a regular grammar (XGrammar aborts).
  if (/\(\?[=!<]|\\[1-9]|\\k</.test(p)) {
    fail(path, "lookaround, backreferences and named groups are not supported");
  }
}
