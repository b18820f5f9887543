#!/usr/bin/env bash
# The main job, for now a store demo: one process appends a stream of frames while another
# follows it live from a second process; then the store is verified and described.
# Usage: scripts/demo.sh [frames]    (default 1,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
frames=${1:-1000000}

echo "== building (release)"
cargo build --release --quiet -p seqstream-store
tool="${CARGO_TARGET_DIR:-target}/release/storetool"

dir=$(mktemp -d "${TMPDIR:-/tmp}/seqstream-demo.XXXXXX")
tail_pid=
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

echo "== store in $dir: 64 MiB segments, stream 7"
"$tool" append "$dir" --stream-id 7 --count 1 --segment-size $((64 << 20)) 2>/dev/null

echo "== a tailer process follows the stream live (storetool tail -f) while an appender process writes $frames frames of 16-512 bytes"
"$tool" tail -f --from-seq 1 --until-seq "$frames" --check-pattern --summary "$dir" >"$dir/tail.out" &
tail_pid=$!
start=$(date +%s.%N)
"$tool" append "$dir" --stream-id 7 --count $((frames - 1)) --min-size 16 --max-size 512 \
  --segment-size $((64 << 20))
end=$(date +%s.%N)
wait "$tail_pid"
tail_pid=
echo "appender: $((frames - 1)) frames in $(echo "$end - $start" | bc) s (process start included)"
echo "tailer:   $(cat "$dir/tail.out")"

echo "== storetool verify (checksums, seq contiguity, segment chain, index)"
"$tool" verify "$dir"

echo "== storetool info"
"$tool" info "$dir"

echo "== the last 3 frames"
"$tool" tail -n 3 "$dir"

echo "== seek by time: the first frame at or after the middle of the stream's time range"
mid=$("$tool" info --json "$dir" | python3 -c 'import json,sys; j=json.load(sys.stdin); print((j["first_timestamp_ns"]+j["last_timestamp_ns"])//2)')
"$tool" dump --from-time "$mid" --count 1 "$dir"
