// Builds libkvrelay with CMake when the library is missing, older than any native source, or was
// configured with another CUDA choice. Used by every deno task so a fresh clone needs only
// `deno task <x>`; not a general build system. The CUDA backend (minutes of nvcc) is built only
// when a CUDA device answers or it is asked for; otherwise -DKVR_CUDA=OFF.

const USAGE =
  `usage: deno task build:native [--cuda | --no-cuda] [--lib-only] [--force] [--quiet] [-- -DNAME=VALUE ...]

Builds build/native/libkvrelay.so (CMake, Release) when it is missing or older than native/.
  --cuda      build the CUDA backend (needs nvcc) even where no CUDA device answers
  --no-cuda   build the CPU backend only (the default when no CUDA device answers)
  --lib-only  the library alone, not the test library and g++ test programs (what serving needs)
  --force     rebuild even when the library is up to date
  --quiet     no "up to date" line
  -DNAME=VALUE  passed to CMake as is (e.g. -DKVR_CUDA=ON, -DCMAKE_CUDA_ARCHITECTURES=90a-real)`;

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
  if (code !== 0) {
    console.error(`build:native: ${cmd} ${args.join(" ")} failed with exit code ${code}`);
    Deno.exit(1);
  }
}

/** Whether a CUDA device answers: `nvidia-smi -L` lists one (no driver, no device → false). */
async function cudaDevicePresent(): Promise<boolean> {
  try {
    const { code, stdout } = await new Deno.Command("nvidia-smi", {
      args: ["-L"],
      stdout: "piped",
      stderr: "null",
    }).output();
    return code === 0 && /^GPU \d+/m.test(new TextDecoder().decode(stdout));
  } catch {
    return false;
  }
}

/** The KVR_CUDA value an existing build directory was configured with, or null. */
async function configuredCuda(): Promise<string | null> {
  const cache = await Deno.readTextFile(`${buildDir}/CMakeCache.txt`).catch(() => "");
  return /^KVR_CUDA:BOOL=(\w+)$/m.exec(cache)?.[1] ?? null;
}

const flags = new Set<string>();
const cmakeDefs: string[] = [];
for (const a of Deno.args) {
  if (a === "--") continue;
  if (a.startsWith("-D") && a.length > 2) cmakeDefs.push(a);
  else if (
    ["--quiet", "--force", "--cuda", "--no-cuda", "--lib-only", "--help", "-h"].includes(a)
  ) flags.add(a);
  else {
    console.error(`build:native: unknown option "${a}"\n${USAGE}`);
    Deno.exit(2);
  }
}
if (flags.has("--help") || flags.has("-h")) {
  console.log(USAGE);
  Deno.exit(0);
}
if (flags.has("--cuda") && flags.has("--no-cuda")) {
  console.error("build:native: --cuda and --no-cuda exclude each other");
  Deno.exit(2);
}
const explicitCuda = cmakeDefs.map((d) => /^-DKVR_CUDA(?::BOOL)?=(.*)$/.exec(d)?.[1]).find((v) =>
  v !== undefined
);
let cuda: "ON" | "OFF";
if (explicitCuda !== undefined) cuda = /^(on|1|true|yes|y)$/i.test(explicitCuda) ? "ON" : "OFF";
else if (flags.has("--cuda")) cuda = "ON";
else if (flags.has("--no-cuda")) cuda = "OFF";
else cuda = await cudaDevicePresent() ? "ON" : "OFF";

const sourcesMtime = Math.max(
  await newestSourceMtime(`${root}native`),
  (await Deno.stat(`${root}CMakeLists.txt`)).mtime?.getTime() ?? 0,
);
const mtime = (p: string) => Deno.stat(p).then((s) => s.mtime?.getTime() ?? 0, () => 0);
// The g++ test programs CMakeLists.txt builds beside the library (tests run them).
const programs = [...(await Deno.readTextFile(`${root}CMakeLists.txt`)).matchAll(
  /^add_executable\((\w+)/gm,
)].map((m) => m[1]);
const libOnly = flags.has("--lib-only");
// Without --lib-only the test library (libkvrelay_test.so: the same objects plus kvrelay_test.h's
// hooks, which the tests and benchmarks open) and the test programs are built too.
const libMtime = Math.min(
  await mtime(libPath),
  ...(libOnly ? [] : await Promise.all(
    [...programs, "libkvrelay_test.so"].map((p) => mtime(`${buildDir}/${p}`)),
  )),
);
const before = await configuredCuda();
// A library built with CUDA still serves a CPU-only machine (auto falls back), so an automatic
// OFF does not rebuild an ON build; an explicit choice, or ON over an OFF build, does.
const askedOff = explicitCuda !== undefined || flags.has("--no-cuda");
const cudaChanged = before !== null && before !== cuda && (cuda === "ON" || askedOff);

if (flags.has("--force") || libMtime < sourcesMtime || cudaChanged || cmakeDefs.length > 0) {
  console.error(
    `building ${libPath} (CUDA backend ${
      cuda === "ON" ? "on" : "off: no CUDA device; --cuda builds it"
    }) ...`,
  );
  await run("cmake", [
    "-S",
    root,
    "-B",
    buildDir,
    "-DCMAKE_BUILD_TYPE=Release",
    `-DKVR_CUDA=${cuda}`,
    ...cmakeDefs.filter((d) => !/^-DKVR_CUDA(?::BOOL)?=/.test(d)),
  ]);
  await run("cmake", [
    "--build",
    buildDir,
    "--parallel",
    ...(libOnly ? ["--target", "kvrelay"] : []),
  ]);
} else if (!flags.has("--quiet")) {
  console.error(`${libPath} is up to date`);
}
