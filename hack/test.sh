#!/usr/bin/env bash
# Runs every minik8s test: formatting and lints, unit and integration tests (the storage suite
# on the embedded store and on a private etcd, the crash test), then the conformance scenarios.
source "$(dirname "$0")/lib.sh"
need_root
phases=()
phase_start=$SECONDS
# Closes the phase that began at $phase_start, named $1.
phase() { phases+=("$1 $((SECONDS - phase_start))"); phase_start=$SECONDS; }
"$ROOT/hack/install-deps.sh" --node --slurm
cd "$ROOT"
# No incremental cache in a one-off test build: it would add gigabytes of disk for no gain.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
command -v kubectl >/dev/null || die "the conformance suite drives the stock kubectl, which is not on the PATH"
# Upstream's v1.34 kubectl and Helm 3 (conformance/tests/current_clients.rs) and Knative's kn
# (conformance/tests/knative.rs), built from Go modules.
"$ROOT/hack/upstream.sh" kubectl helm kn
phase "dependencies and upstream clients"

# A suite that was killed rather than finished (a cut-off session, a cancelled job) leaves its
# nodes behind: processes of the project's binaries and of their private containerds, pod
# processes in the suite's cgroups, and a node's mounts (overlays, network namespaces, volumes)
# in its temporary folders. No test outlives the suite, so whatever of them is here now is stale: swept first,
# or the stale pods' addresses and ports would meet this run's.
sweep_killed_runs() {
  # The suite's clusters and nodes always keep their state in a tempdir (/tmp/.tmpXXXXXX).
  pkill -9 -f '/target/(debug|release)/[^ /]+ .*/tmp/\.tmp[^/ ]*/' 2>/dev/null && log "stopped processes of a killed test run" || true
  # containerd is started by name; its shims by absolute path. The suite's image registry too.
  pkill -9 -f '^(/[^ ]*/)?containerd(-shim-runc-v2)? .*/tmp/\.tmp[^/ ]*/' 2>/dev/null || true
  pkill -9 -f '^(/[^ ]*/)?docker-registry serve /tmp/\.tmp[^/ ]*/' 2>/dev/null || true
  # Edge machines on Docker run a private dockerd (its containerd is matched above).
  pkill -9 -f '^(/[^ ]*/)?dockerd .*/tmp/\.tmp[^/ ]*/' 2>/dev/null || true
  local tasks
  for tasks in $(find /sys/fs/cgroup -path '*/minik8s-test/*' -name tasks 2>/dev/null); do
    xargs -r kill -9 <"$tasks" 2>/dev/null || true
  done
  awk '$2 ~ /^\/tmp\/\.tmp[^\/]*\/.*\/(containerd|pods|docker)\// {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  find /sys/fs/cgroup -depth -type d -path '*/minik8s-test*' -exec rmdir {} + 2>/dev/null || true
  # The suite's machines are network namespaces `mk8s-<name>` joined to this one by veths
  # `mk8sv-<name>` (conformance/src/machines.rs); deleting one takes its veth with it.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^mk8s-/ {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # The forwarding guard of a killed node (kubelet/src/netguard.rs): its mark names a process
  # that is gone; with no live mark left, the guard's chains go, as the last node's release
  # would have removed them.
  local mark pid
  for mark in /run/minik8s/guard/*; do
    [ -f "$mark" ] || continue
    pid="$(cat "$mark" 2>/dev/null)"
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] || rm -f "$mark"
  done
  if [ -z "$(ls -A /run/minik8s/guard 2>/dev/null)" ] && iptables -w -S MINIK8S-GUARD >/dev/null 2>&1; then
    while iptables -w -t mangle -D POSTROUTING -j MINIK8S-GUARD 2>/dev/null; do :; done
    while iptables -w -D FORWARD -j MINIK8S-GUARD 2>/dev/null; do :; done
    while iptables -w -D FORWARD -j MINIK8S-FORWARD 2>/dev/null; do :; done
    local table chain
    for table in mangle filter; do
      for chain in MINIK8S-GUARD MINIK8S-FORWARD; do
        iptables -w -t "$table" -F "$chain" 2>/dev/null && iptables -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
    log "removed the forwarding guard of a killed test run"
  fi
}
sweep_killed_runs
# The build needs ~10 GB (target/debug) beside the Go caches of the upstream clients; a disk
# that runs out shows only as a linker's bus error, so the space is reported before and after.
disk() { log "disk: $(df -h --output=avail "$ROOT/target" 2>/dev/null | tail -1 | tr -d ' ') free, target $(du -sh "$ROOT/target" 2>/dev/null | cut -f1)"; }
mkdir -p "$ROOT/target"
disk
# And again at the end, killed or not: a test that leaves something behind (a container whose
# start never came) must not meet the next run, nor outlive this one.
trap sweep_killed_runs EXIT

log "cargo fmt --check"
cargo fmt --all -- --check
log "structure: no import circle or bare spawn, and docs/architecture.md's figures current"
bash "$ROOT/hack/structure-figures.sh" --check
log "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
phase "fmt, structure and clippy"
log "cargo test"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/minik8s-cargo-test.log
status=${PIPESTATUS[0]}
set -e

# Where the time went, at the end where a CI log's tail shows it: each phase, and the slowest
# test binaries (cargo's "Running <binary>" paired with its "finished in <seconds>").
phases+=("cargo test (build and run) $((SECONDS - phase_start))")
log "time by phase (s):"
printf '  %s\n' "${phases[@]}"
log "the slowest test binaries (s):"
awk '/^ *Running / { bin = $NF; gsub(/[()]/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin); name = bin " " $(NF-1) } /^test result:.* finished in / { t = $NF; sub(/s$/, "", t); if (name != "") printf "  %8.1f  %s\n", t, name; name = "" }' /tmp/minik8s-cargo-test.log | sort -rn | head -20 || true
awk '/^test result:.* finished in / { t = $NF; sub(/s$/, "", t); sum += t } END { printf "  %8.1f  all test binaries together (the rest of cargo test is its build)\n", sum }' /tmp/minik8s-cargo-test.log

# One closing line over every test binary (cargo's own last line is a doc-test summary).
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } } END { print p+0, f+0 }' /tmp/minik8s-cargo-test.log)
disk
echo "summary: $passed passed, $failed failed"
exit "$status"
