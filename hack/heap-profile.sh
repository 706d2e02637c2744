#!/usr/bin/env bash
# Where the idle control plane's heap goes: runs `minik8s up` (UP_FLAGS, default
# `--no-node --no-functions --no-router`) under valgrind's massif with the system allocator
# (massif hooks malloc; jemalloc is the release default), takes a detailed snapshot of the
# live heap after SETTLE seconds (default 120: valgrind runs the start-up ~20× slower) and
# prints it with ms_print, then stops the process.
#   cargo build --release -p minik8s --bin minik8s --features system-allocator
#   bash hack/heap-profile.sh target/release/minik8s > /tmp/heap.txt
source "$(dirname "$0")/lib.sh"
SETTLE="${SETTLE:-120}"
PORT="${PORT:-6482}"
THRESHOLD="${THRESHOLD:-0.5}"
UP_FLAGS="${UP_FLAGS:---no-node --no-functions --no-router}"
bin="${1:-$ROOT/target/release/minik8s}"
[ -x "$bin" ] || die "$bin is not an executable"
command -v valgrind > /dev/null && command -v vgdb > /dev/null && command -v ms_print > /dev/null ||
  die "valgrind (with vgdb and ms_print) is needed: apt-get install valgrind"
dir="$(mktemp -d /tmp/minik8s-heap.XXXXXX)"
pid=
# Stopped and removed however the script ends (a failed snapshot must not leave it running);
# `wait` does not wait inside an EXIT trap, so it polls until valgrind has written its file.
cleanup() {
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
# shellcheck disable=SC2086
valgrind --tool=massif --threshold="$THRESHOLD" --vgdb=yes --massif-out-file="$dir/exit.massif" \
  "$bin" up $UP_FLAGS --data-dir "$dir/data" --bind 127.0.0.1 --port "$PORT" > "$dir/log" 2>&1 &
pid=$!
sleep "$SETTLE"
kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; die "$bin exited (log above)"; }
vgdb --pid="$pid" detailed_snapshot "$dir/idle.massif" > /dev/null
kill -TERM "$pid"
wait "$pid" || true
pid=
ms_print --threshold="$THRESHOLD" "$dir/idle.massif"
