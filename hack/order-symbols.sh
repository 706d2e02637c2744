#!/usr/bin/env bash
# Regenerates minik8s/startup.order: the functions the `minik8s` binary runs while the control
# plane idles, then those it runs only while it starts (`up --no-node --no-functions
# --no-router`, then `up --no-node`), as valgrind's callgrind records them. minik8s/build.rs
# hands the file to the linker (`--symbol-ordering-file`), which lays these functions out in
# that order at the start of .text: the code an idle control plane keeps running is a few dense
# megabytes, start-up's code follows it, and the rest of the binary after both. `minik8s up`
# gives start-up's pages back once it has settled (minik8s/src/startup_code.rs); the idle code
# faults back in packed together instead of as 64 KiB fault-around windows scattered over the
# binary. Symbols the file names that a build no longer has are skipped; functions it does not
# name are placed after it as before, so a stale file costs memory, never correctness.
#   bash hack/order-symbols.sh [target/release/minik8s]
# Start-up is taken to last until `up` gives its code back (ready + 10 s); IDLE (default 310 s)
# is how long the idle phase is recorded after that: past the first renewal of every watch
# (kube-rs's watches end after 290 s and are made again), which is idle work too, as are Lease
# renewals (2 s) and discovery refreshes (30 s). The store's history is compacted every minute
# here (`--etcd-compaction-interval`, 5 minutes by default), so compacting, idle work too, is
# recorded within that time.
source "$(dirname "$0")/lib.sh"
BIN="$(realpath "${1:-$ROOT/target/release/minik8s}")"
IDLE="${IDLE:-310}"
command -v valgrind >/dev/null || die "valgrind is missing: apt-get install valgrind"
work="$(mktemp -d /tmp/minik8s-order.XXXXXX)"
trap 'rm -rf "$work"' EXIT
i=0
for flags in "--no-node --no-functions --no-router" "--no-node"; do
  i=$((i + 1))
  mkdir -p "$work/data$i"
  log "profiling up $flags under callgrind"
  # shellcheck disable=SC2086
  valgrind --tool=callgrind --demangle=no --compress-strings=no --compress-pos=no \
    --dump-line=no --callgrind-out-file="$work/out$i" \
    "$BIN" up $flags --etcd-compaction-interval=1m --data-dir "$work/data$i" --bind 127.0.0.1 --port $((6490 + i)) \
    > "$work/log$i" 2>&1 &
  pid=$!
  for _ in $(seq 1500); do
    grep -q "giving start-up's code back" "$work/log$i" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/log$i" >&2; die "minik8s exited under callgrind"; }
    sleep 0.2
  done
  grep -q "giving start-up's code back" "$work/log$i" \
    || { cat "$work/log$i" >&2; die "minik8s did not finish starting under callgrind"; }
  # Each dump holds the counts since the one before and zeroes them: outN.1 start-up's,
  # outN.2 idling's (the file written at exit holds shutting down's, left out).
  callgrind_control --dump=start-up "$pid" > /dev/null
  sleep "$IDLE"
  callgrind_control --dump=idle "$pid" > /dev/null
  sleep 2
  kill -TERM "$pid"
  wait "$pid" || true
  [ -s "$work/out$i" ] || { cat "$work/log$i" >&2; die "callgrind wrote nothing"; }
done
# Every function that ran (`fn=` lines name each once per file), idle phases' first, then the
# start-up dumps', first seen first, once: Rust's and C's (ring, jemalloc). Names carry the hash
# of their crate's build; local copies also carry the `.llvm.<hash>` of their codegen unit,
# which changes whenever that unit's code does, so it is left out here and the linker driver
# (hack/link/cc) finds this build's copies by the rest of the name. Rerun this after larger
# changes (it is a profile, like PGO's). (callgrind marks recursion levels with a `'N` suffix.)
idle=("$work"/out1.2 "$work"/out2.2)
starts=("$work"/out1.1 "$work"/out2.1)
for f in "${idle[@]}" "${starts[@]}"; do [ -s "$f" ] || die "callgrind_control wrote no $f"; done
functions() {
  awk '/^fn=/ { sub(/^fn=/, ""); sub(/'"'"'[0-9]+$/, ""); sub(/\.llvm\.[0-9]+$/, ""); print }' "$@"
}
{ functions "${idle[@]}"; echo "# start-up"; functions "${starts[@]}"; } \
  | awk '!seen[$0]++' | grep -v -E '^0x|^\(below main\)$' > "$work/order"
idle_count="$(sed -n '/^# start-up$/q;p' "$work/order" | wc -l)"
grep -v '^# start-up$' "$work/order" > "$ROOT/minik8s/startup.order"
log "$(wc -l < "$ROOT/minik8s/startup.order") functions in minik8s/startup.order, the first $idle_count run while idle"
