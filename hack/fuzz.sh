#!/usr/bin/env bash
# Fuzzes every target in fuzz/ (cargo fuzz: libFuzzer with coverage, on the nightly
# toolchain) for SECONDS each (default 600), on a working copy of its seed corpus, and
# prints per target the executions, coverage and what it found. The targets are those with a
# seed corpus (fuzz/corpus/<target>/; minik8s_fuzz::TARGETS lists them), all run by the one
# fuzz binary (MINIK8S_FUZZ_TARGET picks). An input that crashes a target is left in
# fuzz/artifacts/<target>/; keep it under fuzz/regressions/<target>/ with the fix
# (tests/corpus.rs replays it in the test suite).
#
#   hack/fuzz.sh [SECONDS] [TARGET...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds="${1:-600}"
shift || true
cd "$ROOT"

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

targets=("$@")
if [ "${#targets[@]}" = 0 ]; then
  mapfile -t targets < <(ls fuzz/corpus)
fi
# The fuzzers' own copies: the checked-in corpus stays the small seed set.
work="$ROOT/target/fuzz-corpus"
log "building the fuzz targets (nightly, sanitizer coverage)"
cargo +nightly fuzz build --fuzz-dir fuzz -O fuzz
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "$ROOT/fuzz/artifacts/$t"
  cp -n "$ROOT/fuzz/corpus/$t/"* "$work/$t/" 2>/dev/null || true
  out="$work/$t.log"
  log "fuzzing $t for ${seconds}s"
  if MINIK8S_FUZZ_TARGET="$t" cargo +nightly fuzz run --fuzz-dir fuzz -O fuzz "$work/$t" -- \
      -artifact_prefix="$ROOT/fuzz/artifacts/$t/" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 >"$out" 2>&1; then
    status=ok
  else
    status=CRASH
    failed=1
  fi
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out" | grep -o '[0-9]*$' || echo '?')"
  cov="$(grep -o 'cov: [0-9]*' "$out" | tail -1 | grep -o '[0-9]*' || echo '?')"
  ft="$(grep -o 'ft: [0-9]*' "$out" | tail -1 | grep -o '[0-9]*' || echo '?')"
  corpus="$(find "$work/$t" -type f | wc -l)"
  printf '%-16s %-6s executions %-10s coverage %-6s features %-6s corpus %s\n' \
    "$t" "$status" "$execs" "$cov" "$ft" "$corpus"
  if [ "$status" = CRASH ]; then
    grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "$out" | head -8 >&2
  fi
done
exit "$failed"
