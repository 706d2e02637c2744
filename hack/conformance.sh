#!/usr/bin/env bash
# Upstream's current e2e conformance suite, Kubernetes v1.34's e2e.test built from Go modules,
# against a two-node minik8s cluster: `minik8s init` on this machine and one worker that joins
# from its own network namespace, as a second machine on a node network would (the machines
# conformance/src/machines.rs makes for the multinode tests).
#
#   bash hack/conformance.sh build        e2e.test, ginkgo, kubectl and the images' programs
#                                         (hack/upstream.sh), then the images
#   bash hack/conformance.sh run [FOCUS]  bring up the two nodes, run the [Conformance] specs
#                                         (parallel, then [Serial]), tear everything down
#   bash hack/conformance.sh report DIR   per-SIG pass counts of a finished run's JUnit files
#   bash hack/conformance.sh down         tear down what a killed run left
#
# PROFILE=v1.20 runs the older profile, v1.20.2's suite built from Debian's source package
# (hack/conformance-1.20.sh), instead.
# WORK (default target/conformance) holds the binaries, images, cluster and results. PROCS
# (default 4) is the parallel pass's ginkgo processes. PREBUILT=1 uses the release binary
# already built instead of building it first. A full run takes over an hour on 2 cores:
# not part of CI (CI runs the clients' suites, conformance/tests/current_clients.rs).
source "$(dirname "$0")/lib.sh"
need_root
if [ "${PROFILE:-v1.34}" = v1.20 ]; then exec "$ROOT/hack/conformance-1.20.sh" "$@"; fi
[ "${PROFILE:-v1.34}" = v1.34 ] || die "unknown PROFILE ${PROFILE} (known: v1.34, v1.20)"
WORK="$(realpath -m "${WORK:-$ROOT/target/conformance}")"
BIN="$WORK/bin"
DATA="$WORK/cluster"
PORT=6448
# The node network (as conformance/src/machines.rs): this machine on a bridge, the worker in a
# network namespace behind a veth.
NET_BRIDGE=mk8snet
HOST_IP=10.250.0.1
WORKER=e2e-w1
WORKER_IP=10.250.0.2
WORKER_NS="mk8s-$WORKER"
# The control plane's node pulls from the local registry on loopback; the worker, through a
# second registry process serving the same data on the node network.
REGISTRY=127.0.0.1:5058
WORKER_REGISTRY="$HOST_IP:5059"
mkdir -p "$WORK" "$BIN"

build() {
  BIN="$BIN" "$ROOT/hack/upstream.sh" e2e ginkgo kubectl agnhost nnp sample-apiserver
  local src
  src="$(cd "$ROOT/conformance/upstream" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  "$ROOT/hack/conformance-images.sh" v1.34 "$WORK" "$BIN" "$src"
  # The binary is whole: it lists the [Conformance] specs.
  local n
  n="$("$BIN/e2e.test" --list-conformance-tests 2>/dev/null | grep -c '^- testname:' || true)"
  log "e2e.test lists $n [Conformance] specs"
}

report() {
  local dir="$1"
  python3 - "$dir" <<'PY'
import glob, re, sys, collections, xml.etree.ElementTree as ET
per = collections.defaultdict(lambda: [0, 0, 0])
failed = []
for f in glob.glob(sys.argv[1] + "/junit_*.xml"):
    for case in ET.parse(f).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[Conformance]" not in name:
            continue
        sig = (re.search(r"\[sig-([a-z-]+)\]", name) or [None, "other"])[1]
        if case.find("skipped") is not None:
            per[sig][2] += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            per[sig][1] += 1
            failed.append(name)
        else:
            per[sig][0] += 1
p = sum(v[0] for v in per.values()); t = sum(v[0] + v[1] for v in per.values())
for sig, (ok, bad, skip) in sorted(per.items()):
    print(f"sig-{sig:<20} {ok:4d} passed {bad:4d} failed {skip:4d} skipped")
print(f"total {p}/{t} passed ({100 * p / max(t, 1):.1f} %)")
for n in sorted(failed):
    print("FAILED", n)
PY
}

# Removes what a run made: the worker (its processes, namespace and veth), the second
# registry, the egress guard, the control plane's node (hack/down.sh) and the node network.
down() {
  pkill -TERM -f "minik8s join .*--data-dir $DATA/" 2>/dev/null || true
  pkill -TERM -f "minik8s init --data-dir $DATA/" 2>/dev/null || true
  pkill -TERM -f "docker-registry serve $DATA/worker-registry" 2>/dev/null || true
  sleep 2
  # Each node by its name (its guard mark is named after it); the worker's rules are in its
  # own namespace.
  if [ -x "$ROOT/target/release/minik8s" ]; then
    if [ -e "/run/netns/$WORKER_NS" ]; then
      nsenter --net="/run/netns/$WORKER_NS" "$ROOT/target/release/minik8s" down \
        --data-dir "$DATA/$WORKER" --node-name "$WORKER" >/dev/null 2>&1 || true
    fi
    "$ROOT/target/release/minik8s" down --data-dir "$DATA/$WORKER" --node-name "$WORKER" >/dev/null 2>&1 || true
    "$ROOT/target/release/minik8s" down --data-dir "$DATA/cp" --node-name e2e-cp >/dev/null 2>&1 || true
  fi
  ip netns del "$WORKER_NS" 2>/dev/null || true
  ip link del "mk8sv-$WORKER" 2>/dev/null || true
  ip link del "$NET_BRIDGE" 2>/dev/null || true
  egress_guard off
}

# While the suite runs, nothing from a pod or from the worker leaves through the machine's
# uplink: the specs' traffic stays on this machine (pods' DNS goes to the node's resolver
# through the cluster DNS, which runs on this machine, not through FORWARD).
egress_guard() {
  local uplink
  uplink="$(ip route show default | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i+1); exit } }')"
  [ -n "$uplink" ] || return 0
  iptables -w -D FORWARD -j MINIK8S-E2E-EGRESS 2>/dev/null || true
  iptables -w -F MINIK8S-E2E-EGRESS 2>/dev/null || true
  iptables -w -X MINIK8S-E2E-EGRESS 2>/dev/null || true
  [ "$1" = on ] || return 0
  iptables -w -N MINIK8S-E2E-EGRESS
  for src in 10.244.0.0/16 10.250.0.0/24; do
    iptables -w -A MINIK8S-E2E-EGRESS -s "$src" -o "$uplink" -m comment --comment "minik8s e2e: stays on this machine" -j DROP
  done
  iptables -w -I FORWARD 1 -j MINIK8S-E2E-EGRESS
}

node_network() {
  ip link show "$NET_BRIDGE" >/dev/null 2>&1 || ip link add "$NET_BRIDGE" type bridge
  ip addr replace "$HOST_IP/24" dev "$NET_BRIDGE"
  ip link set "$NET_BRIDGE" up
  ip netns del "$WORKER_NS" 2>/dev/null || true
  ip link del "mk8sv-$WORKER" 2>/dev/null || true
  ip netns add "$WORKER_NS"
  ip link add "mk8sv-$WORKER" type veth peer name eth0 netns "$WORKER_NS"
  ip link set "mk8sv-$WORKER" master "$NET_BRIDGE" up
  ip -n "$WORKER_NS" addr add "$WORKER_IP/24" dev eth0
  ip -n "$WORKER_NS" link set eth0 up
  ip -n "$WORKER_NS" link set lo up
  ip -n "$WORKER_NS" route add default via "$HOST_IP"
}

worker_registry() {
  local dir="$DATA/worker-registry"
  mkdir -p "$dir"
  cat > "$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $DATA/cp/registry/data
  maintenance:
    readonly:
      enabled: true
http:
  addr: $WORKER_REGISTRY
EOF
  /opt/minik8s/docker-registry/usr/bin/docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
}

run() {
  local focus="${1:-\[Conformance\]}" results join_line
  [ -x "$BIN/e2e.test" ] && [ -f "$WORK/images/.done" ] || build
  results="$WORK/results/$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$results"
  # PREBUILT=1 runs the release binary already built (a re-run of the same code).
  if [ "${PREBUILT:-0}" = 1 ] && [ -x "$ROOT/target/release/minik8s" ]; then
    log "using the release binary already built"
  else
    log "building minik8s (release)"
    cargo build --release -p minik8s --bin minik8s --quiet
  fi
  # Every run starts from an empty cluster: objects a failed spec left behind must not
  # decide the next run's results. The built images are kept.
  down
  rm -rf "$DATA"
  mkdir -p "$DATA/cp/images"
  "$ROOT/hack/images.sh" "$DATA/cp/images" >/dev/null
  cp "$WORK"/images/e2e-*.tar "$DATA/cp/images/"
  trap 'down' EXIT INT TERM
  node_network
  egress_guard on
  log "starting minik8s init (data in $DATA, results in $results)"
  RUST_LOG=info "$ROOT/target/release/minik8s" init --data-dir "$DATA/cp" --bind 0.0.0.0 --port "$PORT" \
    --advertise-address "$HOST_IP" --node-name e2e-cp --registry "$REGISTRY" \
    --no-functions --router 127.0.0.1:8089 --no-edge-registry \
    >"$results/init.out" 2>"$results/init.log" &
  for _ in $(seq 180); do
    join_line="$(grep -m1 '^minik8s join ' "$results/init.out" 2>/dev/null || true)"
    [ -n "$join_line" ] && break
    sleep 1
  done
  [ -n "$join_line" ] || die "minik8s init printed no join command (see $results/init.log)"
  export KUBECONFIG="$DATA/cp/admin.kubeconfig"
  worker_registry
  log "joining $WORKER from its own network namespace"
  local -a join_args
  read -r -a join_args <<<"${join_line#minik8s join }"
  mkdir -p "$DATA/$WORKER"
  nsenter --net="/run/netns/$WORKER_NS" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$WORKER" \
    env RUST_LOG=info "$ROOT/target/release/minik8s" join "${join_args[@]}" --node-name "$WORKER" \
    --data-dir "$DATA/$WORKER" --node-ip "$WORKER_IP" --no-router \
    --registry-mirror "$WORKER_REGISTRY" --image "$DATA/cp/images/pause.tar,$DATA/cp/images/busybox.tar" \
    >"$results/join.out" 2>"$results/join.log" &
  for _ in $(seq 180); do
    [ "$(kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready')" = 2 ] && break
    sleep 1
  done
  kubectl get nodes -o wide | tee "$results/nodes.txt"
  [ "$(kubectl get nodes --no-headers 2>/dev/null | grep -c ' Ready')" = 2 ] || die "the two nodes are not Ready"
  export KUBE_TEST_REPO_LIST="$WORK/repo-list.yaml"
  local -a e2e_flags=(--provider=skeleton --kubeconfig="$KUBECONFIG" --kubectl-path="$BIN/kubectl"
    --report-dir="$results" --non-blocking-taints=node-role.kubernetes.io/control-plane)
  local start=$SECONDS
  log "parallel pass ($focus, ${PROCS:-4} processes)"
  "$BIN/ginkgo" --procs="${PROCS:-4}" -v --timeout=6h --focus="$focus" --skip='\[Serial\]|\[Disruptive\]|\[Flaky\]' \
    "$BIN/e2e.test" -- "${e2e_flags[@]}" >"$results/parallel.log" 2>&1 || true
  log "serial pass"
  "$BIN/ginkgo" -v --timeout=6h --focus="\[Serial\].*$focus|$focus.*\[Serial\]" --skip='\[Flaky\]' \
    "$BIN/e2e.test" -- "${e2e_flags[@]}" --report-prefix=serial >"$results/serial.log" 2>&1 || true
  echo "wall time: $(( (SECONDS - start) / 60 )) min" > "$results/summary.txt"
  report "$results" | tee -a "$results/summary.txt"
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  report) report "$2" ;;
  down) down ;;
  *) die "usage: hack/conformance.sh build | run [FOCUS] | report DIR | down" ;;
esac
