#!/usr/bin/env bash
# Time to open a store for writing, with and without seal records (store/FORMAT.md, "Seal
# record"): `storetool append DIR --count 1` on a store of FRAMES frames (default 4,000,000,
# payloads of 100..140 bytes) in 64 MiB segments, ROUNDS times (default 3), each round:
#
#   records      every sealed segment has its seal record: the open scans the active segment
#   no_records   the seal records deleted first: the open scans every sealed segment too (and
#                records them again, as it does for a store written by a build without them)
#   floor        `cat` of the active segment's file: the read no open can skip
#
# once from a cold page cache (as root: caches dropped before each timing; otherwise "cold"
# is skipped) and once warm. Prints one JSON line per case, seconds at the median of ROUNDS,
# and the ratio to the floor in the same run:
#
#   {"bench":"store_open","case":"records_warm","metric":"p50","value":…,"unit":"s","floor":…,"ratio":…}
#
# Usage: scripts/open-time.sh [FRAMES] [ROUNDS]   Builds storetool in release. Works from any
# directory; the store lives in a temporary directory, deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
frames=${1:-4000000}
rounds=${2:-3}
CARGO_INCREMENTAL=0 cargo build --quiet --release -p seqstream-store --bin storetool
tool="${CARGO_TARGET_DIR:-target}/release/storetool"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
store="$dir/store"
"$tool" append "$store" --count "$frames" --min-size 100 --max-size 140 >/dev/null 2>&1
active=$("$tool" info "$store" --json | python3 -c '
import json, sys
print(next(s["file"] for s in json.load(sys.stdin)["segments"] if s["state"] == "active"))')

# seconds CMD...: wall time of CMD, output discarded.
seconds() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s%N)
  awk -v ns=$((end - start)) 'BEGIN { printf "%.4f", ns / 1e9 }'
}
cold() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}
open_store() { "$tool" append "$store" --count 1; }
forget_records() { rm -f "$store"/*.seal; }

temps=(warm)
[ -w /proc/sys/vm/drop_caches ] && temps=(cold warm)
declare -A times
for _ in $(seq "$rounds"); do
  for temp in "${temps[@]}"; do
    for case in floor records no_records; do
      [ "$case" = no_records ] && forget_records
      [ "$temp" = cold ] && cold
      # A warm timing follows an untimed run of the same case, which warms what it reads.
      [ "$temp" = warm ] && { [ "$case" = floor ] && cat "$store/$active" >/dev/null || open_store >/dev/null 2>&1; }
      [ "$temp" = warm ] && [ "$case" = no_records ] && forget_records
      if [ "$case" = floor ]; then
        t=$(seconds cat "$store/$active")
      else
        t=$(seconds open_store)
      fi
      times[$case.$temp]+="$t "
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for temp in "${temps[@]}"; do
  floor=$(echo "${times[floor.$temp]}" | median)
  for case in records no_records; do
    value=$(echo "${times[$case.$temp]}" | median)
    printf '{"bench":"store_open","case":"%s_%s","metric":"p50","value":%s,"unit":"s","floor":%s,"ratio":%s,"frames":%d,"rounds":%d}\n' \
      "$case" "$temp" "$value" "$floor" "$(awk -v v="$value" -v f="$floor" 'BEGIN { printf "%.1f", v / f }')" "$frames" "$rounds"
  done
done
