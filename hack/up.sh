#!/usr/bin/env bash
# Brings up a single-node minik8s cluster on this machine (as root). Idempotent.
#   DATA_DIR (default /var/lib/minik8s) holds the PKI, the store and the admin kubeconfig.
source "$(dirname "$0")/lib.sh"
need_root
"$ROOT/hack/install-deps.sh"
cd "$ROOT"
DATA_DIR="${DATA_DIR:-/var/lib/minik8s}"
log "building minik8s (release)"
cargo build --release -p minik8s --quiet
log "writing certificates and kubeconfigs under $DATA_DIR"
"$ROOT/target/release/minik8s" pki init --data-dir "$DATA_DIR"
log "the apiserver is not built yet (issue 3); until then the kubeconfig can be checked with:"
echo "  KUBECONFIG=$DATA_DIR/admin.kubeconfig kubectl config view"
