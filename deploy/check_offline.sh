#!/usr/bin/env bash
# Replays the CPU image's build steps (deploy/Dockerfile) without a Docker engine and checks that
# the result starts with no network at all: the committed tree is exported (like `COPY . .`), the
# native library built with -DKVR_CUDA=OFF, every entry point cached into a fresh DENO_DIR with
# --frozen; then each function starts inside a network namespace holding only `lo`, with the
# image's `deno run --cached-only --frozen -A` entrypoint, and must answer /readyz and a
# completion. The default image leaves the ONNX part out (the serving deno.json/deno.lock do not
# import it, as with KVRELAY_ONNX=0): the cache must not hold it, and a config with an onnx projector
# must refuse to start (exit 2) naming `projectors.0.path`. Then the ONNX image (KVRELAY_ONNX=1:
# onnxruntime-node added at deno.dev.json's pin): onnxruntime-node must load and run the reference graph
# offline, and the ONNX config start. Needs root (ip netns), the deno binary of
# `npx deno@2.9.6`, cmake and g++.
# Usage: deploy/check_offline.sh [workdir]   (default: a new temp dir, removed at exit)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d /tmp/kvrelay-offline-XXXXXX)}"
ns="kvrt$$-offline"
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  if [ -z "${1:-}" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT

deno="$(npx -y deno@2.9.6 eval 'console.log(Deno.execPath())')"
echo "deno: $deno"
mkdir -p "$work/app" "$work/deno-dir"
git -C "$repo" archive HEAD | tar -x -C "$work/app"
cd "$work/app"
echo "== build (cmake, KVR_CUDA=OFF)"
cmake -S . -B build/native -DCMAKE_BUILD_TYPE=Release -DKVR_CUDA=OFF >/dev/null
cmake --build build/native --parallel >/dev/null
export DENO_DIR="$work/deno-dir" DENO_NO_UPDATE_CHECK=1 KVRELAY_LIB="$work/app/build/native/libkvrelay.so"
cache_entries() {
  "$deno" cache --frozen functions/main.ts functions/generate/main.ts functions/prefill/main.ts \
    functions/migrate/main.ts functions/decode/main.ts >/dev/null 2>&1
}
echo "== default image (KVRELAY_ONNX=0): the serving deno.json/deno.lock, deno cache --frozen"
cache_entries
if grep -q onnxruntime-node deno.json deno.lock || [ -e "$DENO_DIR/npm/registry.npmjs.org/onnxruntime-node" ]; then
  echo "FAILED: onnxruntime-node still in deno.json/deno.lock or the cache"
  exit 1
fi
echo "   DENO_DIR: $(du -sh "$DENO_DIR" | cut -f1) (no onnxruntime-node)"

ip netns add "$ns"
ip -n "$ns" link set lo up
check() { # entry, config, extra env...
  local entry="$1" config="$2"
  shift 2
  echo "== offline start: $entry ($config)"
  ip netns exec "$ns" env PORT=8080 HOST=127.0.0.1 KVRELAY_CONFIG="$config" "$@" \
    "$deno" run --cached-only --frozen -A "$entry" 2>"$work/server.log" &
  local pid=$!
  local ok=0
  for _ in $(seq 1 300); do
    if ip netns exec "$ns" "$deno" eval --quiet \
      'const r = await fetch("http://127.0.0.1:8080/readyz"); Deno.exit(r.ok ? 0 : 1)' \
      2>/dev/null; then
      ok=1
      break
    fi
    sleep 0.2
  done
  if [ "$ok" != 1 ] || ! kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
    echo "FAILED: not ready offline"
    cat "$work/server.log"
    exit 1
  fi
  echo "   ready with no network"
  if [ "$entry" = functions/main.ts ]; then
    ip netns exec "$ns" "$deno" eval --quiet '
      const r = await fetch("http://127.0.0.1:8080/v1/completions", {method: "POST",
        headers: {"content-type": "application/json"},
        body: JSON.stringify({model: "fast", prompt: "The ship sailed", max_tokens: 4})});
      const b = await r.json(); console.log("   completion:", r.status, JSON.stringify(b.choices?.[0]?.text));
      Deno.exit(r.ok ? 0 : 1)'
  fi
  kill -TERM "$pid"
  wait "$pid" || true
}
check functions/main.ts config/local.json
for tier in fast balanced powerful; do
  fn=$("$deno" eval --quiet "console.log(JSON.parse(Deno.readTextFileSync('deploy/configs/$tier.json')).deploy.function)")
  check "functions/$fn/main.ts" "deploy/configs/$tier.json" \
    KVRELAY_REDIS_URL=redis://127.0.0.1:6379 KVRELAY_SNAPSHOT_KEY=offline-check-key-0123456789 \
    KVRELAY_TENANT_SALT=t KVRELAY_API_KEYS=k
done

# A config whose only projector is the ONNX one (fast -> powerful).
mlp=models/projectors/tiny-fast--tiny-powerful-mlp
"$deno" eval --quiet "
  const c = JSON.parse(Deno.readTextFileSync('config/local.json'));
  c.projectors = [{ ...c.projectors[0], from: 'fast', to: 'powerful', path: '../$mlp' }];
  Deno.writeTextFileSync('config/onnx-check.json', JSON.stringify(c));"
echo "== default image, offline start with an onnx projector must refuse (exit 2) naming it"
set +e
ip netns exec "$ns" env PORT=8080 HOST=127.0.0.1 KVRELAY_CONFIG=config/onnx-check.json \
  timeout 120 "$deno" run --cached-only --frozen -A functions/main.ts 2>"$work/server.log"
rc=$?
set -e
if [ "$rc" != 2 ] || ! grep -q "projectors.0.path: .*is an onnx projector" "$work/server.log"; then
  echo "FAILED: expected exit 2 naming projectors.0.path, got $rc"
  cat "$work/server.log"
  exit 1
fi
echo "   refused: $(grep -m1 'projectors.0.path' "$work/server.log" | cut -c1-150)..."

echo "== ONNX image (KVRELAY_ONNX=1): deno add onnxruntime-node (deno.dev.json's pin), deno cache --frozen"
"$deno" add "$(sed -n 's/.*"onnxruntime-node": "\(npm:[^"]*\)".*/\1/p' deno.dev.json)" >/dev/null 2>&1
cache_entries
echo "   DENO_DIR: $(du -sh "$DENO_DIR" | cut -f1)"
echo "== ONNX kind offline: onnxruntime-node loads from the cache and runs the reference graph"
ip netns exec "$ns" "$deno" eval --cached-only --frozen --quiet "
  import { loadOnnxRuntime } from './lib/migrate/onnx.ts';
  const meta = JSON.parse(Deno.readTextFileSync('$mlp/projector.json'));
  const ort = await loadOnnxRuntime();
  const s = await ort.InferenceSession.create('$mlp/' + meta.onnx.file);
  const w = meta.features.source_width, f = () => new ort.Tensor('float32', new Float32Array(3 * w), [3, w]);
  const out = await s.run({ [meta.onnx.inputs.k]: f(), [meta.onnx.inputs.v]: f() });
  console.log('   ran offline: output dims', JSON.stringify(out[meta.onnx.outputs.k].dims));"
check functions/main.ts config/onnx-check.json
echo "OK: every entry point starts from the default image's cache with no network and refuses an"
echo "    onnx projector by name; the ONNX image runs the ONNX kind offline"
