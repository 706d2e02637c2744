#!/usr/bin/env bash
# Idle footprint of `minik8s up` (the whole single-node cluster: control plane, node,
# Functions, router, registry) doing no work: CPU time used by the minik8s process over
# IDLE_SECONDS (default 60) after the node is Ready and SETTLE seconds (default 30) have
# passed, and its RSS at the end. Several binaries are measured one after another in one
# run, so a change can be compared with its baseline side by side:
#   bash hack/idle-cpu.sh /tmp/minik8s-before target/release/minik8s
# (default: target/release/minik8s). Each run has its own data folder and port, and is
# stopped and cleaned (hack/down.sh) before the next starts.
source "$(dirname "$0")/lib.sh"
need_root
IDLE_SECONDS="${IDLE_SECONDS:-60}"
SETTLE="${SETTLE:-30}"
PORT="${PORT:-6470}"
[ $# -gt 0 ] || set -- "$ROOT/target/release/minik8s"
"$ROOT/hack/images.sh" "$ROOT/target/images"
hz="$(getconf CLK_TCK)"
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
for bin in "$@"; do
  [ -x "$bin" ] || die "$bin is not an executable"
  dir="$(mktemp -d /tmp/minik8s-idle.XXXXXX)"
  mkdir -p "$dir/images"
  cp "$ROOT"/target/images/*.tar "$ROOT"/target/images/*.tag "$dir/images/" 2>/dev/null || true
  "$bin" up --data-dir "$dir" --bind 127.0.0.1 --port "$PORT" > "$dir/log" 2>&1 &
  pid=$!
  export KUBECONFIG="$dir/admin.kubeconfig"
  for _ in $(seq 240); do
    kubectl wait node --all --for=condition=Ready --timeout=1s >/dev/null 2>&1 && break
    sleep 0.5
  done
  kubectl wait node --all --for=condition=Ready --timeout=5s >/dev/null \
    || { kill -TERM "$pid"; wait "$pid" || true; DATA_DIR="$dir" "$ROOT/hack/down.sh" >/dev/null 2>&1; die "$bin: the node did not become Ready (log: $dir/log)"; }
  sleep "$SETTLE"
  t0="$(ticks "$pid")"
  sleep "$IDLE_SECONDS"
  t1="$(ticks "$pid")"
  rss="$(awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$pid/status")"
  awk -v b="$bin" -v t="$((t1 - t0))" -v hz="$hz" -v s="$IDLE_SECONDS" -v rss="$rss" \
    'BEGIN { printf "%s: %.2f s of CPU over %d s idle (%.2f %% of one core), RSS %s MiB\n", b, t / hz, s, 100 * t / hz / s, rss }'
  kill -TERM "$pid"
  wait "$pid" || true
  DATA_DIR="$dir" "$ROOT/hack/down.sh" >/dev/null 2>&1 || true
  rm -rf "$dir"
done
