// Reads the KVR_API declarations of a C header and compares them with a Deno FFI symbol table:
// the check that keeps lib/native/symbols.ts equal to native/include/kvrelay.h (run by
// symbols_header_test.ts). Only the C subset the header uses: `KVR_API <type> <name>(<params>);`
// with scalar, pointer and `const`-qualified parameter types.

/** One KVR_API function as the header declares it, in Deno FFI types. */
export interface HeaderFunction {
  name: string;
  parameters: string[];
  result: string;
}

/** A Deno FFI symbol definition (the fields this check reads). */
export interface FfiSymbol {
  name?: string;
  parameters: readonly string[];
  result: string;
}

const SCALARS: Readonly<Record<string, string>> = {
  void: "void",
  uint8_t: "u8",
  int8_t: "i8",
  uint16_t: "u16",
  int16_t: "i16",
  uint32_t: "u32",
  int32_t: "i32",
  uint64_t: "u64",
  int64_t: "i64",
  size_t: "usize",
  float: "f32",
  double: "f64",
};

/**
 * The FFI type of a C type. A pointer to an opaque handle (`handles`) passes as "pointer"; any
 * other pointer parameter is a caller-owned buffer ("buffer"); a returned pointer is "pointer".
 */
function ffiType(cType: string, handles: ReadonlySet<string>, isResult: boolean): string {
  const t = cType.replace(/\bconst\b/g, " ").replace(/\bstruct\b/g, " ").replace(/\s+/g, " ")
    .trim();
  const stars = (t.match(/\*/g) ?? []).length;
  const base = t.replace(/\*/g, "").trim();
  if (stars === 0) {
    const scalar = SCALARS[base];
    if (scalar === undefined) throw new Error(`unknown C type "${cType}"`);
    return scalar;
  }
  if (isResult) return "pointer";
  return stars === 1 && handles.has(base) ? "pointer" : "buffer";
}

/** Splits a parameter declaration ("const float* logits") into its type ("const float*"). */
function parameterType(decl: string): string {
  const m = decl.trim().match(/^(.*?[\s*])([A-Za-z_]\w*)$/);
  if (!m) throw new Error(`cannot read parameter "${decl}"`);
  return m[1];
}

/** `text` without comments and preprocessor lines. */
function stripComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/.*$/gm, " ")
    .replace(/^\s*#.*$/gm, " ");
}

/**
 * Every KVR_API function declared in `header` (comments and preprocessor lines ignored).
 * @param header the header's text
 * @param included headers it includes, whose opaque handle typedefs it uses
 */
export function parseHeader(header: string, included = ""): HeaderFunction[] {
  const code = stripComments(header);
  const handles = new Set<string>();
  for (
    const m of stripComments(included + code).matchAll(/typedef\s+struct\s+(\w+)\s+(\w+)\s*;/g)
  ) {
    handles.add(m[1]);
    handles.add(m[2]);
  }
  const out: HeaderFunction[] = [];
  for (const m of code.matchAll(/KVR_API\s+([^;(]*?)\b([A-Za-z_]\w*)\s*\(([^)]*)\)\s*;/g)) {
    const params = m[3].trim();
    out.push({
      name: m[2],
      result: ffiType(m[1], handles, true),
      parameters: params === "void" || params === ""
        ? []
        : params.split(",").map((p) => ffiType(parameterType(p), handles, false)),
    });
  }
  return out;
}

/**
 * Differences between the header's functions and an FFI symbol table, one line each: a symbol the
 * header lacks, a header function no symbol opens, and a parameter or result type that differs.
 * Empty when they agree. A symbol opened under another key names its C function in `name`.
 */
export function compareWithHeader(
  functions: readonly HeaderFunction[],
  table: Readonly<Record<string, FfiSymbol>>,
): string[] {
  const byName = new Map(functions.map((f) => [f.name, f]));
  const opened = new Set<string>();
  const diff: string[] = [];
  for (const [key, sym] of Object.entries(table)) {
    const cName = sym.name ?? key;
    const fn = byName.get(cName);
    if (!fn) {
      diff.push(`${key}: no KVR_API function ${cName} in the header`);
      continue;
    }
    opened.add(cName);
    const want = `(${fn.parameters.join(", ")}) -> ${fn.result}`;
    const got = `(${sym.parameters.join(", ")}) -> ${sym.result}`;
    if (want !== got) diff.push(`${key}: header ${want}, symbols ${got}`);
  }
  for (const fn of functions) {
    if (!opened.has(fn.name)) diff.push(`${fn.name}: declared in the header, not in the symbols`);
  }
  return diff;
}
