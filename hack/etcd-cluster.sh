#!/usr/bin/env bash
# A private 3-member etcd (Debian's etcd-server) with client and peer TLS from the cluster CA,
# for `minik8s up|init --storage etcd://…` with several apiservers. Members listen on loopback
# ports; their state is in DATA_DIR/etcd-cluster/mN (DATA_DIR is minik8s's data folder, default
# /var/lib/minik8s: the CA and the apiserver's etcd client certificate are the ones there).
# Nothing system-wide is changed.
#   hack/etcd-cluster.sh up [DATA_DIR]        starts the members not running (idempotent) and
#                                             prints etcd://HOST:PORT,HOST:PORT,HOST:PORT
#   hack/etcd-cluster.sh down [DATA_DIR]      stops every member (the data stays; PURGE=1
#                                             removes it); nothing is left running
#   hack/etcd-cluster.sh kill N [DATA_DIR]    SIGKILLs member N (1-3), for fault drills;
#                                             `up` starts it again on its data
#   hack/etcd-cluster.sh status [DATA_DIR]    each member's health and the leader
# BASE_PORT (default 23790): member N serves clients on BASE_PORT+N and peers on BASE_PORT+10+N.
# MEMBERS (default 3; 1 for a single member, as benchmarks compare against).
# MEMBER_HOSTS: one address per member instead of ETCD_HOST for all, and MEMBER_NETNS: the
# network namespace each member runs in ("-" for this machine's): one member per machine, as
# the multi-machine tests place them.
# ETCD_HOST (default 127.0.0.1): the address the members listen on (an address of this machine other
# machines reach, for control-plane machines elsewhere; the certificates name it).
# MINIK8S: the minik8s binary that issues the certificates (default: the release build, else
# the debug build, else one is built).
source "$(dirname "$0")/lib.sh"
cmd="${1:-}"
[ -n "$cmd" ] || die "usage: $0 up|down|kill N|status [DATA_DIR]"
shift
member=""
if [ "$cmd" = kill ]; then
  member="${1:-}"
  [[ "$member" =~ ^[123]$ ]] || die "usage: $0 kill 1|2|3 [DATA_DIR]"
  shift
fi
DATA_DIR="$(realpath -m "${1:-${DATA_DIR:-/var/lib/minik8s}}")"
BASE_PORT="${BASE_PORT:-23790}"
ETCD_HOST="${ETCD_HOST:-127.0.0.1}"
MEMBERS="${MEMBERS:-3}"
[[ "$MEMBERS" =~ ^[13]$ ]] || die "MEMBERS is 1 or 3"
members() { seq "$MEMBERS"; }
dir="$DATA_DIR/etcd-cluster"
pki="$DATA_DIR/pki"
nth() { local n="$1"; shift; eval "echo \${$n}"; }
host_of() {
  if [ -n "${MEMBER_HOSTS:-}" ]; then
    # shellcheck disable=SC2086
    nth "$1" $MEMBER_HOSTS
  else echo "$ETCD_HOST"; fi
}
netns_of() {
  if [ -n "${MEMBER_NETNS:-}" ]; then
    # shellcheck disable=SC2086
    nth "$1" $MEMBER_NETNS
  else echo "-"; fi
}
member_ips() {
  local out="$ETCD_HOST"
  for n in $(members); do out="$out,$(host_of "$n")"; done
  echo "$out"
}
client_url() { echo "https://$(host_of "$1"):$((BASE_PORT + $1))"; }
peer_url() { echo "https://$(host_of "$1"):$((BASE_PORT + 10 + $1))"; }
running() { [ -f "$dir/m$1.pid" ] && kill -0 "$(cat "$dir/m$1.pid")" 2>/dev/null; }
endpoints() {
  local out=""
  for n in $(members); do out="$out${out:+,}$(client_url "$n")"; done
  echo "$out"
}
etcdctl_tls() {
  ETCDCTL_API=3 etcdctl --cacert "$pki/ca.crt" --cert "$pki/apiserver-etcd-client.crt" \
    --key "$pki/apiserver-etcd-client.key" --dial-timeout 2s --command-timeout 3s "$@"
}

minik8s_bin() {
  if [ -n "${MINIK8S:-}" ]; then echo "$MINIK8S"
  elif [ -x "$ROOT/target/release/minik8s" ]; then echo "$ROOT/target/release/minik8s"
  elif [ -x "$ROOT/target/debug/minik8s" ]; then echo "$ROOT/target/debug/minik8s"
  else
    (cd "$ROOT" && cargo build --release -p minik8s --bin minik8s --quiet)
    echo "$ROOT/target/release/minik8s"
  fi
}

start_member() {
  local n="$1" cluster=""
  for i in $(members); do cluster="$cluster${cluster:+,}m$i=$(peer_url "$i")"; done
  mkdir -p "$dir/m$n"
  chmod 700 "$dir/m$n"
  local inside=()
  [ "$(netns_of "$n")" = "-" ] || inside=(ip netns exec "$(netns_of "$n")")
  # setsid: the member outlives this script and a terminal's Ctrl-C; `down` stops it.
  setsid "${inside[@]}" etcd --name "m$n" --data-dir "$dir/m$n/data" \
    --listen-client-urls "$(client_url "$n")" --advertise-client-urls "$(client_url "$n")" \
    --listen-peer-urls "$(peer_url "$n")" --initial-advertise-peer-urls "$(peer_url "$n")" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    --initial-cluster-token minik8s-etcd \
    --cert-file "$pki/etcd/server.crt" --key-file "$pki/etcd/server.key" \
    --trusted-ca-file "$pki/ca.crt" --client-cert-auth \
    --peer-cert-file "$pki/etcd/peer.crt" --peer-key-file "$pki/etcd/peer.key" \
    --peer-trusted-ca-file "$pki/ca.crt" --peer-client-cert-auth \
    --logger zap --log-outputs stderr \
    > "$dir/m$n/log" 2>&1 < /dev/null &
  echo $! > "$dir/m$n.pid"
}

stop_member() {
  local n="$1" signal="$2" pid
  running "$n" || { rm -f "$dir/m$n.pid"; return 0; }
  pid="$(cat "$dir/m$n.pid")"
  kill "-$signal" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  rm -f "$dir/m$n.pid"
}

case "$cmd" in
  up)
    command -v etcd >/dev/null || die "etcd is missing: run hack/install-deps.sh"
    mkdir -p "$dir"
    "$(minik8s_bin)" pki etcd --data-dir "$DATA_DIR" --member-ip "$(member_ips)" > /dev/null
    for n in $(members); do running "$n" || start_member "$n"; done
    for _ in $(seq 150); do
      if etcdctl_tls --endpoints "$(endpoints)" endpoint health > /dev/null 2>&1; then
        echo "etcd://$(endpoints | sed 's#https://##g')"
        exit 0
      fi
      for n in $(members); do
        running "$n" || { cat "$dir/m$n/log" >&2; die "etcd member m$n exited (its log above)"; }
      done
      sleep 0.2
    done
    # What each member said last, so the failing test shows why.
    for n in $(members); do
      echo "--- m$n (last lines of $dir/m$n/log)" >&2
      tail -n 15 "$dir/m$n/log" >&2 2>/dev/null || true
    done
    etcdctl_tls --endpoints "$(endpoints)" endpoint health >&2 2>&1 || true
    die "the etcd members did not become healthy in 30 s (logs in $dir/m*/log)"
    ;;
  down)
    for n in 1 2 3; do stop_member "$n" TERM; done
    [ "${PURGE:-0}" = 1 ] && rm -rf "$dir"
    exit 0
    ;;
  kill)
    stop_member "$member" KILL
    ;;
  status)
    etcdctl_tls --endpoints "$(endpoints)" endpoint status -w table || true
    etcdctl_tls --endpoints "$(endpoints)" endpoint health
    ;;
  *) die "usage: $0 up|down|kill N|status [DATA_DIR]" ;;
esac
