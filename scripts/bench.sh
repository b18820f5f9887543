#!/usr/bin/env bash
# Benchmark report: runs store, sbe, replication, composite, inbound and feeds, and writes
#   OUT_DIR/figures.jsonl   every figure, one JSON object a line (bench --json)
#   OUT_DIR/figures.md      the same as a Markdown table (bench table), also printed
#   OUT_DIR/hgrm/           each latency distribution and its floor, HdrHistogram text format
#   OUT_DIR/plots/          one SVG per distribution: latency by percentile, figure and floor
#
# Usage: scripts/bench.sh [--quick] [--aeron] [OUT_DIR]
#   --quick   the short form of every bench (seconds, for smoke runs and shared machines)
#   --aeron   also Aeron's UDP ping-pong against its raw UDP floor (scripts/aeron.sh --no-e2e,
#             into OUT_DIR/aeron; builds Aeron's C source, and apt-installs what that needs)
#   OUT_DIR   default target/bench-report (in the repository); a relative path is taken from
#             the current directory
# Builds `bench` in release into ${CARGO_TARGET_DIR:-target}. Works from any directory.
set -euo pipefail

usage() { sed -n '2,14s/^# \{0,1\}//p' "$0"; }

quick=()
aeron=0
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --aeron) aeron=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "bench.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *)
      [ -z "$out" ] || { echo "bench.sh: one OUT_DIR only" >&2; exit 2; }
      out=$1
      ;;
  esac
  shift
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "$out" ]; then
  out=$root/target/bench-report
elif [[ $out != /* ]]; then
  out=$PWD/$out
fi
cd "$root"

# protoc for the build; etcd for `bench e2e`'s sequencer group cases.
scripts/deps.sh --tests
echo "== building bench (release)" >&2
cargo build --release --quiet -p bench
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$root/$target
bench=$target/release/bench

mkdir -p "$out"
rm -rf "$out/hgrm" "$out/plots"
: >"$out/figures.jsonl"
# The store's and the composite's latency cases pin their writing and reading threads to cores 0
# and 1 (unpinned on one core): two unpinned threads sometimes share a core, which moves
# their hand-off from hundreds of ns to microseconds between runs.
pins=()
[ "$(nproc)" -lt 2 ] || pins=(--writer-core 0 --reader-core 1)
for b in store sbe replication composite inbound e2e feeds; do
  echo "== bench $b ${quick[*]}" >&2
  extra=()
  case $b in store | composite) extra=("${pins[@]}") ;; esac
  "$bench" "$b" "${quick[@]}" "${extra[@]}" --json --hgrm-dir "$out/hgrm" >>"$out/figures.jsonl"
done
if [ "$aeron" -eq 1 ]; then
  echo "== aeron ${quick[*]}" >&2
  "$root/scripts/aeron.sh" "${quick[@]}" --no-e2e "$out/aeron" >/dev/null
  cat "$out/aeron/aeron.jsonl" >>"$out/figures.jsonl"
fi

echo "== plots" >&2
"$bench" plot --hgrm-dir "$out/hgrm" --out "$out/plots" >/dev/null
"$bench" table --json "$out/figures.jsonl" >"$out/figures.md"

echo
cat "$out/figures.md"
echo
echo "figures:  $out/figures.jsonl ($(wc -l <"$out/figures.jsonl") figures)"
echo "table:    $out/figures.md"
echo "hgrm:     $out/hgrm/ ($(find "$out/hgrm" -name '*.hgrm' | wc -l) files)"
echo "plots:    $out/plots/ ($(find "$out/plots" -name '*.svg' | wc -l) SVGs)"
