#!/usr/bin/env bash
# Regenerates minik8s/startup.order: the functions the `minik8s` binary runs while the control
# plane starts and idles (`up --no-node --no-functions --no-router`, then `up --no-node`), as
# valgrind's callgrind records them. minik8s/build.rs hands the file to the linker
# (`--symbol-ordering-file`), which lays these functions out together at the start of .text:
# the pages start-up touches are then few and dense instead of scattered over the whole
# binary, each pulling in its 64 KiB fault-around window. Symbols the file names that a build
# no longer has are skipped; functions it does not name are placed after it as before, so a
# stale file costs memory, never correctness.
#   bash hack/order-symbols.sh [target/release/minik8s]
source "$(dirname "$0")/lib.sh"
BIN="$(realpath "${1:-$ROOT/target/release/minik8s}")"
SETTLE="${SETTLE:-45}"
command -v valgrind >/dev/null || die "valgrind is missing: apt-get install valgrind"
work="$(mktemp -d /tmp/minik8s-order.XXXXXX)"
trap 'rm -rf "$work"' EXIT
i=0
for flags in "--no-node --no-functions --no-router" "--no-node"; do
  i=$((i + 1))
  mkdir -p "$work/data$i"
  log "profiling up $flags under callgrind ($SETTLE s)"
  # shellcheck disable=SC2086
  valgrind --tool=callgrind --demangle=no --compress-strings=no --compress-pos=no \
    --dump-line=no --callgrind-out-file="$work/out$i" \
    "$BIN" up $flags --data-dir "$work/data$i" --bind 127.0.0.1 --port $((6490 + i)) \
    > "$work/log$i" 2>&1 &
  pid=$!
  sleep "$SETTLE"
  kill -TERM "$pid"
  wait "$pid" || true
  [ -s "$work/out$i" ] || { cat "$work/log$i" >&2; die "callgrind wrote nothing"; }
done
# Every function that ran (`fn=` lines name each once per file), first seen first, once: Rust's
# and C's (ring, jemalloc). Names carry the hash of their crate's build, and local copies the
# `.llvm.<hash>` of their codegen unit, which changes when that unit's code does: rerun this
# after larger changes (it is a profile, like PGO's).
# (callgrind marks recursion levels with a `'N` suffix.)
awk '/^fn=/ { sub(/^fn=/, ""); sub(/'"'"'[0-9]+$/, ""); if (!seen[$0]++) print }' "$work"/out* \
  | grep -v -E '^0x|^\(below main\)$' > "$ROOT/minik8s/startup.order"
log "$(wc -l < "$ROOT/minik8s/startup.order") functions in minik8s/startup.order"
