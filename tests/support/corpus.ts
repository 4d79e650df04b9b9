// Where tests find English text: a 64 KiB sample of the demo corpus's validation split bundled in
// tests/data (see its README for sources), so no test depends on ../shared being present.

/** Absolute path of the bundled validation-text sample. */
export const VALID_SAMPLE_PATH = new URL("../data/valid-sample.txt", import.meta.url).pathname;

/**
 * Reads the bundled validation-text sample.
 * @returns The sample text (about 64 KiB).
 */
export function readValidSample(): Promise<string> {
  return Deno.readTextFile(VALID_SAMPLE_PATH);
}
