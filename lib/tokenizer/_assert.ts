// Test helpers over node:assert/strict (JSR's @std/assert is unreachable here): the few
// assert* shapes the tokenizer and engine tests use. Test-only; not exported from mod.ts.

import nodeAssert from "node:assert/strict";

export function assert(cond: unknown, msg?: string): asserts cond {
  nodeAssert.ok(cond, msg);
}
export function assertEquals<T>(actual: T, expected: T, msg?: string): void {
  nodeAssert.deepStrictEqual(actual, expected, msg);
}
export function assertNotEquals<T>(actual: T, expected: T, msg?: string): void {
  nodeAssert.notDeepStrictEqual(actual, expected, msg);
}
// deno-lint-ignore no-explicit-any
type ErrorClass = new (...args: any[]) => Error;
export function assertThrows(fn: () => unknown, cls: ErrorClass, includes?: string): Error {
  let caught: unknown;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  return check(caught, cls, includes);
}
export async function assertRejects(
  fn: () => Promise<unknown>,
  cls: ErrorClass,
  includes?: string,
): Promise<Error> {
  let caught: unknown;
  try {
    await fn();
  } catch (e) {
    caught = e;
  }
  return check(caught, cls, includes);
}
function check(caught: unknown, cls: ErrorClass, includes?: string): Error {
  nodeAssert.ok(caught !== undefined, `expected ${cls.name} to be thrown, nothing was`);
  nodeAssert.ok(
    caught instanceof cls,
    `expected ${cls.name}, got ${(caught as Error)?.name}: ${(caught as Error)?.message}`,
  );
  if (includes !== undefined) {
    nodeAssert.ok(
      (caught as Error).message.includes(includes),
      `message ${JSON.stringify((caught as Error).message)} lacks ${JSON.stringify(includes)}`,
    );
  }
  return caught as Error;
}
