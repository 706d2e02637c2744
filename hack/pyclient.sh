#!/usr/bin/env bash
# Makes (once) a virtualenv with the official Kubernetes Python client from PyPI, pinned,
# pytest, and prometheus_client (whose parser checks the components' /metrics), for the
# conformance suite; prints its python's path.
source "$(dirname "$0")/lib.sh"
VENV="$ROOT/target/pyclient"
PINS=(kubernetes==36.0.3 pytest==8.3.5 prometheus-client==0.21.1)
stamp="$VENV/.pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${PINS[*]}" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
# Debian's python3 (hack/install-deps.sh --node installs python3-venv).
py=/usr/bin/python3
[ -x "$py" ] || py="$(command -v python3)" || die "python3 is missing: run hack/install-deps.sh --node"
rm -rf "$VENV"
log "installing the Python client (${PINS[*]}) into $VENV"
"$py" -m venv "$VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
echo "${PINS[*]}" > "$stamp"
echo "$VENV/bin/python"
