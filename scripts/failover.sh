#!/usr/bin/env bash
# Failover of a sequencer group, measured: SIGKILL of the leader at KILLS random instants
# (default 20), then SWITCHOVERS planned switchovers (default 20, `seqstreamd --switchover`),
# while three applications offer messages through a lossy relay to each member
# (seqstreamd/tests/failover.rs, built in release mode). Each kill's failover time runs from
# the SIGKILL to the new leader's term-start frame (its first frame), each switchover's from
# the request written to etcd to that frame; the killed member comes back with its store each
# time and rejoins as a standby. MEMBERS (2 or 3, default 2): with 3, the third member runs
# on host h2 and one standby is in sync (`sync_standbys = 1`), the other asynchronous.
# Prints one JSON line:
#
#   {"bench":"failover","case":"sigkill_leader","members":2,"sync_standbys":1,"kills":20,"switchovers":20,"lease_ttl_s":1,
#    "sources":3,"relay_drop":0.1,"messages":…,"lost":0,"duplicated":0,"failover_p50_ms":…,
#    "failover_max_ms":…,"switchover_p50_ms":…,"switchover_max_ms":…,
#    "kill_to_confirmed_p50_ms":…,"kill_to_confirmed_max_ms":…,
#    "switchover_to_confirmed_p50_ms":…,"switchover_to_confirmed_max_ms":…,
#    "promotion_p50_ms":…,"promotion_max_ms":…,"tails_cut":…,"seed":…}
#
# (promotion: the members' own measure, from winning a term to a sequencer ready to start it;
# *_to_confirmed: the applications' stall, from the SIGKILL or the request until the client
# has every message offered before it in its replica; tails_cut: unreleased tails cut by
# members rejoining a new leader, from their logs).
# etcd keeps its data on tmpfs (/dev/shm) unless ETCD_TMPDIR names another directory: set it
# to one on disk for etcd's real cost of a synced write.
#
# and fails if any message was lost, duplicated or reordered, or a store is not a prefix of
# the leader's. Every host is a network namespace (the demo's, on one bridge): run it as root.
# Needs what the tests need (scripts/deps.sh --tests installs it).
#
# Usage: scripts/failover.sh [KILLS] [SEED] [SWITCHOVERS] [MEMBERS]   Works from any directory.
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-20}
case $kills in '' | *[!0-9]*) echo "failover.sh: KILLS must be a number, not '$kills'" >&2; exit 2 ;; esac
export FAILOVER_KILLS=$kills
[ -n "${2:-}" ] && export FAILOVER_SEED=$2
switchovers=${3:-20}
case $switchovers in '' | *[!0-9]*) echo "failover.sh: SWITCHOVERS must be a number, not '$switchovers'" >&2; exit 2 ;; esac
export FAILOVER_SWITCHOVERS=$switchovers
members=${4:-2}
case $members in
  2) test=sigkill_of_a_two_member_groups_leader ;;
  3) test=sigkill_of_a_three_member_groups_leader ;;
  *) echo "failover.sh: MEMBERS is 2 or 3, not '$members'" >&2; exit 2 ;;
esac
command -v etcd >/dev/null || { echo "failover.sh: etcd is required (apt-get install etcd-server)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! CARGO_INCREMENTAL=0 timeout 1200 cargo test --quiet --release -p seqstreamd --test failover \
  -- --nocapture "$test" >"$out" 2>&1; then
  cat "$out" >&2
  echo "failover.sh: the failover run failed (its output is above)" >&2
  exit 1
fi
# A failover slower than 200 ms comes with the last lines of the new leader's log (stderr).
grep -A40 'a slow failover' "$out" >&2 || true
grep '^{"bench":"failover"' "$out"
