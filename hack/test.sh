#!/usr/bin/env bash
# Runs every minik8s test: formatting and lints, unit and integration tests (the storage suite
# on the embedded store and on a private etcd, the crash test), then the conformance scenarios.
source "$(dirname "$0")/lib.sh"
need_root
"$ROOT/hack/install-deps.sh" --node --slurm
cd "$ROOT"
# No incremental cache in a one-off test build: it would add gigabytes of disk for no gain.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
command -v kubectl >/dev/null || die "the conformance suite drives the stock kubectl, which is not on the PATH"

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
log "cargo test"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/minik8s-cargo-test.log
status=${PIPESTATUS[0]}
set -e

# One closing line over every test binary (cargo's own last line is a doc-test summary).
read -r passed failed < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } } END { print p+0, f+0 }' /tmp/minik8s-cargo-test.log)
echo "summary: $passed passed, $failed failed"
exit "$status"
