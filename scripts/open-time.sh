#!/usr/bin/env bash
# Time to open a store, for writing and for sequencing, with and without what spares an open
# its reads: seal records (store/FORMAT.md, "Seal record") and source-position checkpoints
# (sequencer/src/source_checkpoint.rs). On a store of FRAMES frames (default 4,000,000,
# payloads of 100..140 bytes) in segments of SEGMENT_BYTES (default 64 MiB), ROUNDS times
# (default 3), each round:
#
#   records            `storetool append DIR --count 1`, every sealed segment with its seal
#                      record: the open scans the active segment
#   no_records         the same with the seal records deleted first: the open scans every
#                      sealed segment too (and records them again, as it does for a store
#                      written by a build without them)
#   sequencer          `sequencer` started on the store, up to its log line "source positions
#                      read" (then stopped): the appender's open and the source positions read
#                      from the newest checkpoint, which the first run wrote
#   sequencer_no_checkpoint   the same with the checkpoints deleted first: every frame read
#   floor              the active segment's header and frames read (`head -c`): the read no
#                      open can skip (its preallocated rest holds no frame)
#
# once from a cold page cache (as root: caches dropped before each timing; otherwise "cold"
# is skipped) and once warm. Prints one JSON line per case, seconds at the median of ROUNDS,
# and the ratio to the floor in the same run:
#
#   {"bench":"store_open","case":"records_warm","metric":"p50","value":…,"unit":"s","floor":…,"ratio":…}
#
# Both opens pretouch the active segment from its end on (the default), which reads as data
# from then on. With large segments, a cold open has the file system zero those pages unread
# (they are not cached) and faults them in anew: the page-cache zeroing of most of a segment,
# where a warm open reads it.
#
# Usage: scripts/open-time.sh [FRAMES] [ROUNDS] [SEGMENT_BYTES]   Builds storetool and
# sequencer in release, unless STORETOOL and SEQUENCER name binaries to time instead (another
# build's, say). Works from any directory; the store lives in a temporary directory, deleted
# at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
frames=${1:-4000000}
rounds=${2:-3}
segment=${3:-67108864}
if [ -z "${STORETOOL:-}" ] || [ -z "${SEQUENCER:-}" ]; then
  CARGO_INCREMENTAL=0 cargo build --quiet --release -p seqstream-store --bin storetool \
    -p seqstream-sequencer --bin sequencer
fi
tool=${STORETOOL:-${CARGO_TARGET_DIR:-target}/release/storetool}
sequencer=${SEQUENCER:-${CARGO_TARGET_DIR:-target}/release/sequencer}
dir=$(mktemp -d)
seq_pid=
trap '[ -z "$seq_pid" ] || kill -9 "$seq_pid" 2>/dev/null; rm -rf "$dir"' EXIT
store="$dir/store"
"$tool" append "$store" --count "$frames" --min-size 100 --max-size 140 \
  --segment-size "$segment" >/dev/null 2>&1
# The active segment's file, and the bytes of it that hold its header and frames.
read -r active held < <("$tool" info "$store" --json | python3 -c '
import json, sys
s = next(s for s in json.load(sys.stdin)["segments"] if s["state"] == "active")
print(s["file"], 4096 + s["committed_position"] - s["base_position"])')

# seconds CMD...: wall time of CMD, output discarded.
seconds() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s%N)
  awk -v ns=$((end - start)) 'BEGIN { printf "%.4f", ns / 1e9 }'
}
read_frames() { head -c "$held" "$store/$active" >/dev/null; }
cold() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}
open_store() { "$tool" append "$store" --count 1 --segment-size "$segment"; }
forget_records() { rm -f "$store"/*.seal; }
forget_checkpoints() { rm -f "$store"/*.srcpos; }

# Prints the seconds from starting `sequencer` on the store to its log line saying the source
# positions are read (20 s at most), then stops it (SIGTERM) and waits for its exit.
open_sequencer() {
  local log="$dir/sequencer.log" start end
  start=$(date +%s%N)
  RUST_LOG=info "$sequencer" --store "$store" --stream-id 1 --listen 127.0.0.1:0 \
    --source 1@127.0.0.1 --no-heartbeat --segment-size "$segment" \
    --counters "$dir/sequencer.counters" >"$log" 2>&1 &
  seq_pid=$!
  for _ in $(seq 20000); do
    grep -q "source positions read" "$log" && break
    kill -0 "$seq_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.001
  done
  end=$(date +%s%N)
  grep -q "source positions read" "$log" || { cat "$log" >&2; exit 1; }
  kill -TERM "$seq_pid"
  wait "$seq_pid" || true
  seq_pid=
  awk -v ns=$((end - start)) 'BEGIN { printf "%.4f", ns / 1e9 }'
}

open_sequencer >/dev/null # its first open reads every frame and writes a checkpoint

temps=(warm)
[ -w /proc/sys/vm/drop_caches ] && temps=(cold warm)
declare -A times
cases=(floor records no_records sequencer sequencer_no_checkpoint)
for _ in $(seq "$rounds"); do
  for temp in "${temps[@]}"; do
    for case in "${cases[@]}"; do
      case $case in
        no_records) forget_records ;;
        sequencer_no_checkpoint) forget_checkpoints ;;
      esac
      [ "$temp" = cold ] && cold
      # A warm timing follows an untimed run of the same case, which warms what it reads.
      if [ "$temp" = warm ]; then
        case $case in
          floor) read_frames >/dev/null ;;
          sequencer*) open_sequencer >/dev/null ;;
          *) open_store >/dev/null 2>&1 ;;
        esac
        case $case in
          no_records) forget_records ;;
          sequencer_no_checkpoint) forget_checkpoints ;;
        esac
      fi
      case $case in
        floor) t=$(seconds read_frames) ;;
        sequencer*) t=$(open_sequencer) ;;
        *) t=$(seconds open_store) ;;
      esac
      times[$case.$temp]+="$t "
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for temp in "${temps[@]}"; do
  floor=$(echo "${times[floor.$temp]}" | median)
  for case in "${cases[@]:1}"; do
    value=$(echo "${times[$case.$temp]}" | median)
    printf '{"bench":"store_open","case":"%s_%s","metric":"p50","value":%s,"unit":"s","floor":%s,"ratio":%s,"frames":%d,"rounds":%d,"segment_bytes":%d}\n' \
      "$case" "$temp" "$value" "$floor" "$(awk -v v="$value" -v f="$floor" 'BEGIN { printf "%.1f", v / f }')" "$frames" "$rounds" "$segment"
  done
done
