#!/usr/bin/env bash
# Idle memory over time: every binary given runs `minik8s up --no-node --no-functions
# --no-router` (override with UP_FLAGS) at the same time, each with its own data folder and
# ports, and every INTERVAL seconds (default 30) for DURATION seconds (default 3600) one line
# prints the minutes since start and, per binary, its VmRSS, its anonymous part and the size
# of its store's file, side by side (every listener on its own port: PORT + i for the API,
# then PORT + 100 + i, + 200, + 300 and + 400 for the edge registry, image registry, functions
# gateway and router):
#   bash hack/idle-rss-trend.sh /tmp/minik8s-before target/release/minik8s
# Everything started is stopped on exit, also when interrupted.
source "$(dirname "$0")/lib.sh"
INTERVAL="${INTERVAL:-30}"
DURATION="${DURATION:-3600}"
PORT="${PORT:-6481}"
UP_FLAGS="${UP_FLAGS:---no-node --no-functions --no-router}"
[ $# -gt 0 ] || set -- "$ROOT/target/release/minik8s"
pids=() dirs=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "${dirs[@]}"
}
trap stop EXIT
i=0
for bin in "$@"; do
  [ -x "$bin" ] || die "$bin is not an executable"
  dir="$(mktemp -d /tmp/minik8s-trend.XXXXXX)"
  # shellcheck disable=SC2086
  MINIK8S_EDGE_REGISTRY="127.0.0.1:$((PORT + 100 + i))" MINIK8S_REGISTRY="127.0.0.1:$((PORT + 200 + i))" \
    MINIK8S_GATEWAY="127.0.0.1:$((PORT + 300 + i))" MINIK8S_ROUTER="127.0.0.1:$((PORT + 400 + i))" \
    "$bin" up $UP_FLAGS --data-dir "$dir" --bind 127.0.0.1 --port "$((PORT + i))" > "$dir/log" 2>&1 &
  pids+=("$!") dirs+=("$dir")
  echo "[$i] $bin (pid $!, log $dir/log)"
  i=$((i + 1))
done
start=$(date +%s)
while [ $(($(date +%s) - start)) -lt "$DURATION" ]; do
  sleep "$INTERVAL"
  line="$(awk -v s="$start" -v n="$(date +%s)" 'BEGIN { printf "%6.1f min", (n - s) / 60 }')"
  for i in "${!pids[@]}"; do
    pid="${pids[$i]}"
    kill -0 "$pid" 2>/dev/null || { cat "${dirs[$i]}/log" >&2; die "[$i] exited (log above)"; }
    store="$(du -sk "${dirs[$i]}/store" 2>/dev/null | cut -f1)"
    line+="$(awk -v i="$i" -v st="${store:-0}" '
      /^VmRSS/ { rss = $2 } /^RssAnon/ { anon = $2 }
      END { printf " | [%s] RSS %5.1f MiB anon %5.1f store %5.1f", i, rss / 1024, anon / 1024, st / 1024 }
    ' "/proc/$pid/status")"
  done
  echo "$line"
done
