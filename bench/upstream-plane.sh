#!/usr/bin/env bash
# Upstream's own control plane, for running the scale benchmark against it beside minik8s:
# etcd 3.6.4, kube-apiserver, kube-controller-manager and kube-scheduler of v1.34, built from
# Go modules by hack/upstream.sh. Everything lives in DIR and listens on loopback: etcd on
# PORT+1 (peers PORT+2), the apiserver on PORT, the controller manager's and scheduler's
# health on PORT+3 and PORT+4. The certificates are `minik8s pki init`'s (the same CA, serving
# certificate and component identities minik8s's own control plane gets); the service-account
# key comes from openssl. The controller manager and scheduler talk to the apiserver at 100
# requests/s (burst 100), as upstream's scalability jobs configure them (their default is 20).
#
#   bench/upstream-plane.sh up DIR [PORT]   start them (default PORT 46443); prints the admin
#                                           kubeconfig once the apiserver is ready
#   bench/upstream-plane.sh down DIR        stop them (SIGTERM, then SIGKILL)
#   bench/upstream-plane.sh pids DIR        the components' process ids, one per line
source "$(dirname "$0")/../hack/lib.sh"

BIN="$ROOT/target/upstream/bin"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

usage() { die "usage: bench/upstream-plane.sh up DIR [PORT] | down DIR | pids DIR"; }

start() {
  local name="$1"
  shift
  "$@" >"$DIR/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}

up() {
  local port="${1:-46443}"
  bash "$ROOT/hack/upstream.sh" "${COMPONENTS[@]}" >&2
  mkdir -p "$DIR"
  local minik8s="${MINIK8S:-$ROOT/target/release/minik8s}"
  [ -x "$minik8s" ] || minik8s="$ROOT/target/debug/minik8s"
  [ -x "$minik8s" ] || die "no minik8s binary for its certificates (cargo build --release)"
  "$minik8s" pki init --data-dir "$DIR" --port "$port" >/dev/null 2>&1 || die "minik8s pki init failed"
  local pki="$DIR/pki"
  if [ ! -f "$pki/sa.key" ]; then
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  fi
  start etcd "$BIN/etcd" --name upstream --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$((port + 1))" \
    --advertise-client-urls "http://127.0.0.1:$((port + 1))" \
    --listen-peer-urls "http://127.0.0.1:$((port + 2))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 2))" \
    --initial-cluster "upstream=http://127.0.0.1:$((port + 2))" \
    --quota-backend-bytes $((8 * 1024 * 1024 * 1024)) --log-level warn
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$((port + 1))" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.96.0.0/12 \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --profiling=false --v=1
  # The controller manager and scheduler once the apiserver serves (and has its bootstrap
  # roles): started earlier, they give up.
  local deadline=$((SECONDS + 120))
  until KUBECONFIG="$DIR/admin.kubeconfig" kubectl get --raw /readyz >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { tail -20 "$DIR/kube-apiserver.log" >&2; die "the upstream apiserver is not ready in 120 s"; }
    for c in etcd kube-apiserver; do
      kill -0 "$(cat "$DIR/$c.pid")" 2>/dev/null || { tail -20 "$DIR/$c.log" >&2; die "$c exited"; }
    done
    sleep 0.5
  done
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$pki/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$pki/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$((port + 3))" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --use-service-account-credentials=true --leader-elect=false \
    --service-cluster-ip-range 10.96.0.0/12 --kube-api-qps 100 --kube-api-burst 100 --v=1
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig "$pki/scheduler.kubeconfig" \
    --authorization-kubeconfig "$pki/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$((port + 4))" --leader-elect=false \
    --kube-api-qps 100 --kube-api-burst 100 --v=1
  sleep 2
  for c in "${COMPONENTS[@]}"; do
    kill -0 "$(cat "$DIR/$c.pid")" 2>/dev/null || { tail -20 "$DIR/$c.log" >&2; die "$c exited"; }
  done
  echo "$DIR/admin.kubeconfig"
}

down() {
  local c pid
  for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    pid="$(cat "$DIR/$c.pid" 2>/dev/null)" || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$DIR/$c.pid"
  done
}

[ $# -ge 2 ] || usage
DIR="$(realpath -m "$2")"
case "$1" in
  up) up "${3:-}" ;;
  down) down ;;
  pids) for c in "${COMPONENTS[@]}"; do cat "$DIR/$c.pid" 2>/dev/null; done ;;
  *) usage ;;
esac
