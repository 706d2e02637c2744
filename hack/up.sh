#!/usr/bin/env bash
# Brings up a single-node minik8s cluster on this machine (as root) in the foreground.
# Idempotent: installs only missing packages, reuses the build, keeps the CA and the store.
#   DATA_DIR (default /var/lib/minik8s) holds the PKI, the store and admin.kubeconfig.
#   PORT (default 6443), STORAGE (default embedded, or etcd://HOST:PORT).
# Stop it with Ctrl-C (SIGINT) or SIGTERM; pods keep running until `bash hack/down.sh`.
source "$(dirname "$0")/lib.sh"
need_root
"$ROOT/hack/install-deps.sh" --node
cd "$ROOT"
DATA_DIR="${DATA_DIR:-/var/lib/minik8s}"
"$ROOT/hack/images.sh" "$DATA_DIR/images"
log "building minik8s and kubectl-fn (release)"
cargo build --release -p minik8s -p minik8s-serverless --bin minik8s --bin kubectl-fn --quiet
# kubectl finds plugins on the PATH by name: `kubectl fn …` runs kubectl-fn.
install -m 0755 "$ROOT/target/release/kubectl-fn" /usr/local/bin/kubectl-fn
log "starting minik8s (data in $DATA_DIR)"
# Bound to every address (as k3s and kubeadm's apiservers are), so pods reach the API through
# the `kubernetes` Service; BIND=127.0.0.1 keeps it to this machine.
exec "$ROOT/target/release/minik8s" up --data-dir "$DATA_DIR" --bind "${BIND:-0.0.0.0}" --port "${PORT:-6443}" --storage "${STORAGE:-embedded}"
