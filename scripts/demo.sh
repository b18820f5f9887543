#!/usr/bin/env bash
# The main job: the whole seqstream topology on one machine, on real CME market data.
#
# Builds the workspace (release), then runs `demo`, which starts three hosts (network
# namespaces as root, loopback addresses otherwise), each one seqstreamd: the sequencer host's
# runs two sequencers (market data, order flow), a compositor and three replication servers;
# each application host's keeps its replicas and forwards its applications' outboxes
# (`--threading shared|dedicated` lays each daemon's roles on one thread or a thread each);
# replays the CME MDP3 capture in data/cme-mdp3 through a feed handler; lets an
# algo trade on it and an OMS answer every order; stops everything; and audits the stores.
# The last line printed is a JSON summary; the exit status is 0 only if every check passed.
#
# Usage: scripts/demo.sh [demo options]      e.g. --pace max, --network loopback, --keep, --feeds both
#        scripts/demo.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
echo "== building (release; a first build takes several minutes)" >&2
cargo build --release --quiet --workspace --bins
exec "${CARGO_TARGET_DIR:-target}/release/demo" "$@"
