#!/usr/bin/env bash
# Stops the cluster started by hack/up.sh and removes its pods, containerd, bridge, cgroups,
# mounts and iptables rules. The store, PKI and kubeconfig in DATA_DIR stay.
source "$(dirname "$0")/lib.sh"
need_root
cd "$ROOT"
DATA_DIR="${DATA_DIR:-/var/lib/minik8s}"
[ -x "$ROOT/target/release/minik8s" ] || cargo build --release -p minik8s --quiet
exec "$ROOT/target/release/minik8s" down --data-dir "$DATA_DIR"
