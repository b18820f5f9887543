#!/usr/bin/env bash
# The main job: the whole seqstream topology on one machine, on real CME market data.
#
# Builds the workspace (release), then runs `demo`, which starts an etcd and four hosts
# (network namespaces on a bridge as root, loopback addresses otherwise), each one seqstreamd:
# two sequencer hosts run each stream's sequencer group (leader and standby, standby-ack
# release); the application hosts keep their replicas, forward their applications' outboxes,
# and host 2 merges the composite from its replicas (`--threading shared|dedicated` lays each
# daemon's roles on one thread or a thread each); replays the CME MDP3 capture in
# data/cme-mdp3 through a feed handler; lets an algo trade on it and an OMS answer every
# order (`--failover`: the leaders' daemon is killed with SIGKILL half way through, and comes
# back as the standby); stops everything; and audits the stores.
# The last line printed is a JSON summary; the exit status is 0 only if every check passed.
#
# Usage: scripts/demo.sh [demo options]      e.g. --failover, --pace max, --network loopback, --keep, --feeds both
#        scripts/demo.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --tests   # etcd: the demo runs its sequencer groups on one
echo "== building (release; a first build takes several minutes)" >&2
cargo build --release --quiet --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/release/demo" "$@"
