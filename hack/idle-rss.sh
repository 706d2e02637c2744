#!/usr/bin/env bash
# Idle memory of the control plane alone: `minik8s up --no-node --no-functions --no-router`
# (override with UP_FLAGS) for each binary given, ROUNDS times alternating (default 2), so a
# change is measured side by side with its baseline:
#   bash hack/idle-rss.sh /tmp/minik8s-before target/release/minik8s
# Each run has its own data folder and port and is stopped before the next. After SETTLE
# seconds (default 60: `up` gives start-up's code back 10 s after it is ready, and the idle
# code faults back in over the next seconds) it prints VmRSS and its anonymous and
# file-backed parts, and the resident and referenced sizes of the mappings as
# /proc/PID/smaps sums them.
source "$(dirname "$0")/lib.sh"
SETTLE="${SETTLE:-60}"
ROUNDS="${ROUNDS:-2}"
PORT="${PORT:-6481}"
UP_FLAGS="${UP_FLAGS:---no-node --no-functions --no-router}"
[ $# -gt 0 ] || set -- "$ROOT/target/release/minik8s"
for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    [ -x "$bin" ] || die "$bin is not an executable"
    dir="$(mktemp -d /tmp/minik8s-rss.XXXXXX)"
    # shellcheck disable=SC2086
    "$bin" up $UP_FLAGS --data-dir "$dir" --bind 127.0.0.1 --port "$PORT" > "$dir/log" 2>&1 &
    pid=$!
    sleep "$SETTLE"
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; die "$bin exited (log above)"; }
    awk -v b="$bin" -v r="$round" '
      /^VmRSS/ { rss = $2 } /^RssAnon/ { anon = $2 } /^RssFile/ { file = $2 }
      END { printf "%s (round %s): RSS %.1f MiB (anonymous %.1f, file-backed %.1f)\n", b, r, rss / 1024, anon / 1024, file / 1024 }
    ' "/proc/$pid/status"
    awk -v exe="$(readlink -f "$bin")" '
      /^[0-9a-f]+-[0-9a-f]+ / { m = ($6 == exe) ? "binary" : ($6 == "" || $6 ~ /^\[/) ? "anonymous" : "libraries" }
      /^Rss:/ { rss[m] += $2 } /^Referenced:/ { ref[m] += $2 }
      END { for (k in rss) printf "  %-10s resident %.1f MiB, referenced %.1f MiB\n", k, rss[k] / 1024, ref[k] / 1024 }
    ' "/proc/$pid/smaps"
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$dir"
  done
done
