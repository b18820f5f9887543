#!/usr/bin/env bash
# Installs the Debian packages seqstream's build needs, where they are missing: protoc and
# protobuf's well-known .proto files (the etcd-client crate's build script compiles etcd's
# .proto files, which import them). With --tests, also what the test suite needs: a real etcd
# server (the election and group tests start their own) and etcdctl (the group tests read
# etcd's keys with it, as an operator would). Uses sudo when not root; does nothing when
# everything is there.
#
# Usage: scripts/deps.sh [--tests]
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
if [ "${1:-}" = "--tests" ]; then
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v etcdctl >/dev/null || need+=(etcd-client)
fi
[ ${#need[@]} -eq 0 ] && exit 0
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
command -v apt-get >/dev/null || {
  echo "deps.sh: install ${need[*]} (Debian package names) and run again" >&2
  exit 1
}
echo "== apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
