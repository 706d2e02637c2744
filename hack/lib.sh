# Shared helpers for hack/ scripts (sourced, not run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$HOME/.cargo/bin:/usr/local/bin:/usr/sbin:/sbin:$PATH"
log() { printf '\033[1m[minik8s]\033[0m %s\n' "$*" >&2; }
die() { printf '[minik8s] error: %s\n' "$*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "run as root (this script installs Debian packages and starts system services)"; }
