#!/usr/bin/env bash
# Idle memory of the control plane alone: `minik8s up --no-node --no-functions --no-router`
# (override with UP_FLAGS) for each binary given, ROUNDS times alternating (default 2), so a
# change is measured side by side with its baseline:
#   bash hack/idle-rss.sh /tmp/minik8s-before target/release/minik8s
# Each run has its own data folder, port and memory cgroup, and is stopped before the next.
# After SETTLE seconds (default 60) it prints, in MiB:
#   VmRSS    resident pages, clean pages of the binary included (which the kernel may drop
#            at any time and which other processes share: a poor measure on its own);
#   RssAnon  the process's private, anonymous memory (heap, stacks, pages it wrote);
#   PSS      its resident pages, each shared page divided among the processes that map it;
#   cgroup   the usage of the cgroup it runs in (`memory.current`; cgroup v1's
#            `memory.usage_in_bytes` where only v1's memory controller is mounted): its
#            anonymous memory and the page cache its reads and writes brought in.
source "$(dirname "$0")/lib.sh"
need_root
SETTLE="${SETTLE:-60}"
ROUNDS="${ROUNDS:-2}"
PORT="${PORT:-6481}"
UP_FLAGS="${UP_FLAGS:---no-node --no-functions --no-router}"
[ $# -gt 0 ] || set -- "$ROOT/target/release/minik8s"
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
  CG_ROOT=/sys/fs/cgroup USAGE=memory.current
else
  CG_ROOT=/sys/fs/cgroup/memory USAGE=memory.usage_in_bytes
fi
[ -d "$CG_ROOT" ] || die "no memory cgroup controller at $CG_ROOT"
kib() { awk -v f="$1" '$1 == f { print $2 }' "$2"; }
mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.1f", k / 1024 }'; }
printf '%-40s %5s %7s %7s %7s %7s\n' binary round VmRSS RssAnon PSS cgroup
run=0
for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    run=$((run + 1))
    [ -x "$bin" ] || die "$bin is not an executable"
    dir="$(mktemp -d /tmp/minik8s-rss.XXXXXX)"
    cg="$CG_ROOT/minik8s-rss-$$-$run"
    mkdir -p "$cg"
    # Into its own cgroup before it starts, so that everything it allocates is counted there.
    # shellcheck disable=SC2086
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" \
      "$bin" up $UP_FLAGS --data-dir "$dir" --bind 127.0.0.1 --port "$PORT" > "$dir/log" 2>&1 &
    pid=$!
    sleep "$SETTLE"
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; die "$bin exited (log above)"; }
    printf '%-40s %5s %7s %7s %7s %7s\n' "$bin" "$round" \
      "$(mib "$(kib VmRSS: "/proc/$pid/status")")" "$(mib "$(kib RssAnon: "/proc/$pid/status")")" \
      "$(mib "$(kib Pss: "/proc/$pid/smaps_rollup")")" \
      "$(awk '{ printf "%.1f", $1 / 1048576 }' "$cg/$USAGE")"
    kill -TERM "$pid"
    wait "$pid" || true
    rmdir "$cg" 2>/dev/null || true
    rm -rf "$dir"
  done
done
