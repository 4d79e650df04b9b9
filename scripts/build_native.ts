// Builds libkvrelay with CMake when the library is missing or older than any native source.
// Used by every deno task so a fresh clone needs only `deno task <x>`; not a general build system.
// Flags: --quiet (no "up to date" line), --force (always rebuild).

const root = new URL("../", import.meta.url).pathname;
const buildDir = `${root}build/native`;
const libPath = `${buildDir}/libkvrelay.so`;

async function newestSourceMtime(dir: string): Promise<number> {
  let newest = 0;
  for await (const entry of Deno.readDir(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) newest = Math.max(newest, await newestSourceMtime(path));
    else newest = Math.max(newest, (await Deno.stat(path)).mtime?.getTime() ?? 0);
  }
  return newest;
}

async function run(cmd: string, args: string[]): Promise<void> {
  // Build chatter goes to stderr: CLI commands print only their result on stdout.
  const { code, stdout } = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "inherit" })
    .output();
  await Deno.stderr.write(stdout);
  if (code !== 0) throw new Error(`${cmd} ${args.join(" ")} failed with exit code ${code}`);
}

const quiet = Deno.args.includes("--quiet");
const force = Deno.args.includes("--force");
const sourcesMtime = Math.max(
  await newestSourceMtime(`${root}native`),
  (await Deno.stat(`${root}CMakeLists.txt`)).mtime?.getTime() ?? 0,
);
const libMtime = await Deno.stat(libPath).then((s) => s.mtime?.getTime() ?? 0, () => 0);

if (force || libMtime < sourcesMtime) {
  console.error(`building ${libPath} ...`);
  await run("cmake", ["-S", root, "-B", buildDir, "-DCMAKE_BUILD_TYPE=Release"]);
  await run("cmake", ["--build", buildDir, "--parallel"]);
} else if (!quiet) {
  console.error(`${libPath} is up to date`);
}
