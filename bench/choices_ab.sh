#!/usr/bin/env bash
# `bench/choices_ab.sh OLD_CHECKOUT NEW_CHECKOUT [pairs] [runs]`: bench/choices.ts (n=4 against n=1
# on tiny-powerful) of two checkouts, each with its own build/native/libkvrelay.so, alternating
# old and new `pairs` times (default 3) with `runs` runs each (default 3), so both see the same
# machine load. Prints each side's medians; compare the "n=4 / n=1" lines.
set -euo pipefail
old="$1" new="$2" pairs="${3:-3}" runs="${4:-3}"
for i in $(seq 1 "$pairs"); do
  for side in old new; do
    dir="$old"
    [ "$side" = new ] && dir="$new"
    echo "== $side (pair $i): $(git -C "$dir" rev-parse --short HEAD)"
    (cd "$dir" && KVRELAY_LIB="$dir/build/native/libkvrelay.so" \
      npx -y deno@2.9.6 run -A --config deno.dev.json bench/choices.ts "$runs" 2>&1 | grep -E 'median')
  done
done
