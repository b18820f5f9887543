#!/usr/bin/env bash
# Aeron's UDP ping-pong beside seqstream's round trip, on this machine, in one run:
# builds bench/aeron (aeron-pingpong: an embedded Aeron C media driver and two clients, from
# the Aeron source the rusteron crates vendor) and runs it, then `bench e2e`, whose
# pingpong_64B is seqstream's round trip, and prints both in one table. Writes
#   OUT_DIR/aeron.jsonl     Aeron's ping-pong against a raw UDP ping-pong floor (--json)
#   OUT_DIR/e2e.jsonl       every `bench e2e` figure (--json)
#   OUT_DIR/pingpong.md     Aeron's figures, e2e's pingpong_64B, offer_to_own_replica_64B and
#                           their _one_thread cases as one table, also printed
#
# Usage: scripts/aeron.sh [--quick] [--no-e2e] [--network loopback|netns|auto] [OUT_DIR]
#   --quick     5,000 Aeron round trips and `bench e2e --quick` (1,000 samples a case)
#   --no-e2e    Aeron's ping-pong only (scripts/bench.sh --aeron runs it so)
#   --network   the hosts of `bench e2e` (default loopback: Aeron runs over loopback too)
#   OUT_DIR     default target/aeron-report (in the repository); relative to the current dir
# Installs what building Aeron needs when it is missing: cmake, clang, libclang-dev,
# libbsd-dev, uuid-dev and pkg-config with apt-get and, where the system's cmake is older
# than Aeron's 3.30 (Debian 12 has 3.25), CMake from PyPI into a venv beside the build.
# Builds into ${CARGO_TARGET_DIR:-target}/aeron and bench into ${CARGO_TARGET_DIR:-target}.
set -euo pipefail

usage() { sed -n '2,20s/^# \{0,1\}//p' "$0"; }

quick=()
e2e=1
network=loopback
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --no-e2e) e2e=0 ;;
    --network)
      [ $# -ge 2 ] || { echo "aeron.sh: --network needs a value" >&2; exit 2; }
      network=$2
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "aeron.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *)
      [ -z "$out" ] || { echo "aeron.sh: one OUT_DIR only" >&2; exit 2; }
      out=$1
      ;;
  esac
  shift
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "$out" ]; then
  out=$root/target/aeron-report
elif [[ $out != /* ]]; then
  out=$PWD/$out
fi
cd "$root"
target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$root/$target

# System packages: cmake and clang/libclang (bindgen) build Aeron; it links libbsd and libuuid.
missing=()
for p in cmake clang libclang-dev libbsd-dev uuid-dev pkg-config; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}" >&2
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y "${missing[@]}" >&2 ||
    { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y "${missing[@]}" >&2; }
fi

# Aeron's CMakeLists.txt needs CMake 3.30 or later.
cmake_at_least_3_30() {
  local major minor
  read -r major minor < <("$1" --version 2>/dev/null |
    sed -n '1s/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p') || return 1
  [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -ge 30 ]; }
}
cmake_bin=$(command -v cmake)
if ! cmake_at_least_3_30 "$cmake_bin"; then
  venv=$target/aeron/cmake-venv
  if ! cmake_at_least_3_30 "$venv/bin/cmake"; then
    echo "== $("$cmake_bin" --version | head -1) is older than Aeron's 3.30: CMake from PyPI into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'cmake>=3.30'
  fi
  cmake_bin=$venv/bin/cmake
fi

echo "== building bench/aeron (release; Aeron's C source on a first build: minutes)" >&2
start=$(date +%s)
CMAKE=$cmake_bin CARGO_INCREMENTAL=0 CARGO_TARGET_DIR=$target/aeron \
  cargo build --release --locked --quiet --manifest-path bench/aeron/Cargo.toml
echo "== bench/aeron built in $(($(date +%s) - start)) s" >&2

mkdir -p "$out"
echo "== aeron-pingpong ${quick[*]}" >&2
"$target/aeron/release/aeron-pingpong" "${quick[@]}" --json >"$out/aeron.jsonl"
if [ "$e2e" -eq 0 ]; then
  cat "$out/aeron.jsonl"
  echo "aeron:  $out/aeron.jsonl"
  exit 0
fi

echo "== building bench (release)" >&2
CARGO_INCREMENTAL=0 cargo build --release --quiet -p bench
bench=$target/release/bench
# `bench e2e` has no option to run one case: all of it runs; the table keeps its two whole-path
# cases.
echo "== bench e2e ${quick[*]} --network $network" >&2
"$bench" e2e "${quick[@]}" --network "$network" --json >"$out/e2e.jsonl"

{
  cat "$out/aeron.jsonl"
  grep -E '"case":"(pingpong_64B|offer_to_own_replica_64B)(_one_thread)?"' "$out/e2e.jsonl"
} | "$bench" table --json - >"$out/pingpong.md"

echo
cat "$out/pingpong.md"
echo
echo "aeron:  $out/aeron.jsonl"
echo "e2e:    $out/e2e.jsonl ($(wc -l <"$out/e2e.jsonl") figures)"
echo "table:  $out/pingpong.md"
