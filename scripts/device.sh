#!/usr/bin/env bash
# The latency targets that need a core for every busy thread (issue 13: the 16-core device
# machine), as one prepared run that fits in that machine's 10-minute command limit. It has no
# Rust toolchain, so the binaries are built here and carried.
#
#   scripts/device.sh prepare [--aeron]
#       here: builds `bench` in release (and with --aeron, aeron-pingpong as scripts/aeron.sh
#       builds it: Aeron's C source, minutes the first time) and puts stripped copies in
#       .device/ (git-ignored; about 8 MiB, 10 with Aeron and the libraries it needs beyond
#       glibc, which the device's image may lack)
#   scripts/device.sh run [--quick] [OUT_DIR]
#       there, or anywhere: runs the benches from .device/ with every thread busy-spinning and
#       writes OUT_DIR/figures.jsonl (every figure), OUT_DIR/figures.md (the table) and
#       OUT_DIR/targets.md (each target, its figure, met or not), and prints the last two.
#       --quick: the benches' short forms (seconds; a smoke run, not figures to report)
#       OUT_DIR: default target/device-report
#
# On the device machine, through the session's `run` tool: carry [".device"], command
# `scripts/device.sh run "$OUT"`, timeout_s 540. A full run should take about 5 minutes there
# (an estimate from runs here; it has not run there yet).
# Busy-spinning threads need a core each: on fewer than 8 cores, `run` says so and goes on
# (its figures then measure the scheduler, not the code).
set -euo pipefail
usage() { sed -n '2,20s/^# \{0,1\}//p' "$0"; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kit=$root/.device
target=${CARGO_TARGET_DIR:-$root/target}

prepare() {
  local aeron=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --aeron) aeron=1 ;;
      *) echo "device.sh prepare: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
  done
  mkdir -p "$kit"
  (cd "$root" && CARGO_INCREMENTAL=0 cargo build --release --quiet -p bench --bin bench)
  strip -o "$kit/bench" "$target/release/bench"
  if [ "$aeron" -eq 1 ]; then
    # aeron.sh installs Aeron's build dependencies, builds aeron-pingpong, then runs it
    # briefly: the binary is what is kept.
    "$root/scripts/aeron.sh" --quick --no-e2e "$target/aeron-report" >/dev/null
    strip -o "$kit/aeron-pingpong" "$target/aeron/release/aeron-pingpong"
    # Its shared libraries beyond glibc (libbsd, libmd, libuuid) may be missing there.
    mkdir -p "$kit/lib"
    ldd "$kit/aeron-pingpong" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so.* | libm.so.* | libgcc_s.so.* | ld-linux*) ;;
        *) cp -L "$path" "$kit/lib/$name" ;;
      esac
    done
  fi
  ls -l "$kit"
}

run() {
  local quick=() out=
  while [ $# -gt 0 ]; do
    case "$1" in
      --quick) quick=(--quick) ;;
      -*) echo "device.sh run: unknown option $1" >&2; usage >&2; exit 2 ;;
      *) out=$1 ;;
    esac
    shift
  done
  out=${out:-$target/device-report}
  local bench=$kit/bench
  [ -x "$bench" ] || { echo "device.sh run: no $bench: run 'scripts/device.sh prepare' first" >&2; exit 1; }
  mkdir -p "$out"
  local cores
  cores=$(nproc)
  if [ "$cores" -lt 8 ]; then
    echo "device.sh: $cores cores: busy-spinning threads will share cores, so these figures measure the scheduler" >&2
  fi
  : >"$out/figures.jsonl"
  # step NAME COMMAND...: one bench, bounded in time; a failure is reported and the rest run.
  step() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    local start=$SECONDS
    if ! timeout 150 "$@" --json >"$out/$name.jsonl" 2>"$out/$name.log"; then
      echo "device.sh: $name failed or ran out of time; the end of its log:" >&2
      tail -5 "$out/$name.log" >&2
    fi
    cat "$out/$name.jsonl" >>"$out/figures.jsonl"
    echo "   $((SECONDS - start)) s, $(wc -l <"$out/$name.jsonl") figures" >&2
  }
  step sbe taskset -c 1 "$bench" sbe "${quick[@]}"
  # The store's and the composite's latency cases pin their writing and reading threads (cores
  # 2 and 3; 0 and 1 on a smaller machine).
  local writer=0 reader=1
  [ "$cores" -lt 4 ] || { writer=2; reader=3; }
  step store "$bench" store "${quick[@]}" --payloads 64,256,1024 --writer-core "$writer" --reader-core "$reader"
  step inbound "$bench" inbound "${quick[@]}" --idle busy-spin
  step replication "$bench" replication "${quick[@]}" --idle busy-spin --followers 1
  step composite "$bench" composite "${quick[@]}" --idle busy-spin --writer-core "$writer" --reader-core "$reader"
  step e2e "$bench" e2e "${quick[@]}" --idle busy-spin --network loopback
  if [ -x "$kit/aeron-pingpong" ]; then
    # Aeron spinning too (its driver spins by default; here ping and pong as well), as ours do.
    step aeron env LD_LIBRARY_PATH="$kit/lib" "$kit/aeron-pingpong" "${quick[@]}" --idle spin
  fi
  "$bench" table --json "$out/figures.jsonl" >"$out/figures.md"
  python3 - "$out/figures.jsonl" "$cores" >"$out/targets.md" <<'EOF'
import json, sys

figures = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("{"):
        f = json.loads(line)
        figures[(f["bench"], f["case"], f["metric"], f["unit"])] = f

def fig(bench, case, metric, unit):
    return figures.get((bench, case, metric, unit))

# (what, figure key, which number, bound, "<=" or ">=")
targets = [
    ("e2e p50, against its floor", ("e2e", "offer_to_own_replica_64B", "p50", "ns"), "ratio", 1.5, "<="),
    ("e2e p99, against its floor's p99", ("e2e", "offer_to_own_replica_64B", "p99", "ns"), "ratio", 3.0, "<="),
    ("inbound p50, against raw UDP one-way", ("inbound", "offer_to_committed_64B", "p50", "ns"), "ratio", 1.5, "<="),
    ("replication p50, against raw TCP one-way", ("replication", "append_to_replica_64B_1f", "p50", "ns"), "ratio", 1.5, "<="),
    ("replication catch-up, share of raw TCP bandwidth", ("replication", "catch_up_64B_1f", "throughput", "GB/s"), "ratio", 0.7, ">="),
    ("store append 256 B, a clock read a frame, share of memcpy", ("store", "append_256B", "throughput", "msgs/s"), "ratio", 0.6, ">="),
    ("store append 256 B, stamped by the caller (the sequencer's batch), share of memcpy", ("store", "append_256B", "throughput_stamped_by_caller", "msgs/s"), "ratio", 0.6, ">="),
    ("MDP3 book decode, against a copy", ("sbe", "decode_mdp3_book_4_150B", "mean", "ns"), "ratio", 2.0, "<="),
    ("compositor p50, against a cache-line hand-off", ("composite", "component_to_composite_64B", "p50", "ns"), "ratio", 2.0, "<="),
    ("compositor p50, embedded (`_invoker`), against a cache-line hand-off", ("composite", "component_to_composite_64B_invoker", "p50", "ns"), "ratio", 2.0, "<="),
]
def show(v):
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

cores = int(sys.argv[2])
if cores < 8:
    print(f"**{cores} cores: busy-spinning threads shared them, so these figures measure the scheduler.**\n")
print("| target | figure | bound | met |")
print("|---|---:|---:|---|")
for what, key, field, bound, op in targets:
    f = fig(*key)
    value = None if f is None else f.get(field)
    if value is None:
        print(f"| {what} | not measured | {op} {bound} | — |")
        continue
    met = value <= bound if op == "<=" else value >= bound
    print(f"| {what} | {show(value)} | {op} {bound} | {'yes' if met else 'no'} |")
aeron = fig("aeron", "aeron_pingpong_64B", "p50", "ns")
for case, what in [
    ("offer_to_own_replica_64B", "e2e p50"),
    ("offer_to_own_replica_64B_one_thread", "e2e `_one_thread` p50"),
]:
    ours = fig("e2e", case, "p50", "ns")
    if ours and aeron:
        met = ours["value"] < aeron["value"]
        print(f"| {what} below Aeron's UDP round trip p50 | {ours['value']:.0f} ns against {aeron['value']:.0f} ns | < Aeron | {'yes' if met else 'no'} |")
    else:
        print(f"| {what} below Aeron's UDP round trip p50 | not measured (prepare --aeron) | < Aeron | — |")
EOF
  cat "$out/figures.md"
  echo
  cat "$out/targets.md"
  echo
  echo "figures: $out/figures.jsonl ($(wc -l <"$out/figures.jsonl")), table: $out/figures.md, targets: $out/targets.md"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
