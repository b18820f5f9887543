#!/usr/bin/env bash
# Instructions per message of the hot paths, counted by callgrind: unlike times, these repeat
# exactly on a noisy machine, so they judge a hot-path change where timings swing.
#
#   sequencer_per_datagram          Sequencer::do_work over 10,000 queued one-message datagrams
#   sequencer_per_datagram_keyed    the same, the source authenticated (--source-key)
#   forwarder_per_message           Forwarder::do_work, 4,000 messages, one a cycle and datagram
#   forwarder_per_message_keyed     the same, each datagram signed
#   append_256B                     Appender::append of a 256-byte payload, 100,000 times
#   replication_client_per_frame    Follower::do_work, 4,000 frames replicated one at a time
#   replication_client_per_frame_delayed_ack
#                                   the same, acknowledging delayed:100us on the workload's
#                                   synthetic clock (1 us a frame): one ack per 100 frames
#   replication_sender_per_frame    the replication sender's do_work over the same frames
#   replication_client_per_frame_tls
#   replication_sender_per_frame_tls
#                                   the same two over TLS (rustls), counted as the difference
#                                   between 8,000 frames and 4,000, per frame: the TLS
#                                   handshake (millions of instructions) left out
#   catch_up_client_per_frame       Follower::do_work, 50,000 frames appended at once and
#                                   replicated in the sender's batches (a follower catching up)
#   catch_up_sender_per_frame       the replication sender's do_work over the same frames
#   compositor_per_frame            Compositor::do_work by arrival, 4,000 frames on each of
#                                   two components (8,000 merged frames)
#   compositor_timestamp_per_frame  the same by timestamp
#   sequencer_idle_cycle            Sequencer::do_work with nothing queued, 100,000 cycles
#   replication_sender_idle_cycle   the replication sender's do_work with nothing new to send,
#                                   100,000 cycles
#   replication_client_idle_cycle   Follower::do_work in the same cycles: a streaming client
#                                   with nothing to receive
#   compositor_idle_cycle           Compositor::do_work with nothing new on its two components,
#                                   100,000 cycles (what a busy-spinning compositor spends
#                                   between frames)
#   tailer_poll_idle                Tailer::poll at the end of a store, 100,000 polls finding
#                                   nothing (the loop of every busy-spinning reader)
#   mdp3_decode_book                a real CME MDP3 book refresh (4 entries) decoded, every
#                                   field read, 100,000 times
#
# Each line is JSON, as the benches print: {"bench":"instructions","case":…,"value":…}.
# The workloads are `hotpaths` (bench/src/bin/hotpaths.rs); the count is inclusive of
# everything the named duty cycle calls (callgrind --toggle-collect), kernel time excluded.
#
# Usage: scripts/instructions.sh   (needs valgrind: Debian's valgrind package)
# Builds `hotpaths` in release into ${CARGO_TARGET_DIR:-target}. Works from any directory.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is required (apt-get install valgrind)" >&2; exit 1; }
CARGO_INCREMENTAL=0 cargo build --quiet --release -p bench --bin hotpaths
bin="${CARGO_TARGET_DIR:-target}/release/hotpaths"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# total FUNCTION ARGS...: the instructions inside FUNCTION in one run of the workload.
total() {
  local function=$1
  shift
  valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect="$function" \
    "$bin" "$@" >/dev/null 2>&1
  local total
  total=$(awk '/^totals:/ {print $2}' "$out")
  [ -n "$total" ] && [ "$total" -gt 0 ] || { echo "instructions.sh: no instructions counted in $function" >&2; exit 1; }
  echo "$total"
}

# report CASE TOTAL MESSAGES: one JSON line, TOTAL / MESSAGES instructions a message.
report() {
  printf '{"bench":"instructions","case":"%s","metric":"per_message","value":%d,"unit":"instructions","total":%d,"messages":%d}\n' \
    "$1" "$(($2 / $3))" "$2" "$3"
}

# count CASE MESSAGES FUNCTION ARGS...: the instructions inside FUNCTION per message.
count() {
  local case=$1 messages=$2 function=$3
  shift 3
  local t
  t=$(total "$function" "$@")
  report "$case" "$t" "$messages"
}

# count_marginal CASE MESSAGES FUNCTION ARGS...: the same per message of the MESSAGES more
# that a run with --frames 2*MESSAGES makes than one with --frames MESSAGES.
count_marginal() {
  local case=$1 messages=$2 function=$3
  shift 3
  local one two
  one=$(total "$function" "$@" --frames "$messages")
  two=$(total "$function" "$@" --frames "$((2 * messages))")
  report "$case" "$((two - one))" "$messages"
}

count sequencer_per_datagram 10000 '*Sequencer*do_work*' sequencer
count sequencer_per_datagram_keyed 10000 '*Sequencer*do_work*' sequencer --keyed
count forwarder_per_message 4000 '*Forwarder*do_work*' forwarder
count forwarder_per_message_keyed 4000 '*Forwarder*do_work*' forwarder --keyed
count append_256B 100000 '*append_all*' append
count replication_client_per_frame 4000 '*Follower*do_work*' replication
count replication_client_per_frame_delayed_ack 4000 '*Follower*do_work*' replication --delayed-ack
count replication_sender_per_frame 4000 '*server*Sender*do_work*' replication
count_marginal replication_client_per_frame_tls 4000 '*Follower*do_work*' replication --tls
count_marginal replication_sender_per_frame_tls 4000 '*server*Sender*do_work*' replication --tls
count catch_up_client_per_frame 50000 '*Follower*do_work*' catch-up
count catch_up_sender_per_frame 50000 '*server*Sender*do_work*' catch-up
count compositor_per_frame 8000 '*Compositor*do_work*' compositor
count compositor_timestamp_per_frame 8000 '*Compositor*do_work*' compositor --timestamp
count sequencer_idle_cycle 100000 '*Sequencer*do_work*' sequencer-idle
count replication_sender_idle_cycle 100000 '*server*Sender*do_work*' replication-idle
count replication_client_idle_cycle 100000 '*Follower*do_work*' replication-idle
count compositor_idle_cycle 100000 '*Compositor*do_work*' compositor-idle
count tailer_poll_idle 100000 '*idle_polls*' tailer-idle
count mdp3_decode_book 100000 '*decode_books*' mdp3
