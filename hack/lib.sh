# Shared helpers for hack/ scripts (sourced, not run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$HOME/.cargo/bin:/usr/local/bin:/usr/sbin:/sbin:$PATH"
log() { printf '\033[1m[minik8s]\033[0m %s\n' "$*" >&2; }
die() { printf '[minik8s] error: %s\n' "$*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "run as root (this script installs Debian packages and starts system services)"; }

# Fills ROOTFS with the node's busybox (hack/busybox.sh: upstream's configuration) and every
# applet's link, its shared libraries and glibc's name-service modules, /etc/nsswitch.conf
# and root and nobody users: the base of the project's busybox image and of the e2e images.
busybox_rootfs() {
  local rootfs="$1" bb libs lib a
  mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/etc" "$rootfs/root"
  bb="$("$ROOT/hack/busybox.sh")"
  cp "$bb" "$rootfs/bin/busybox"
  for a in $("$bb" --list); do [ "$a" = busybox ] || ln -sf busybox "$rootfs/bin/$a"; done
  libs="$(ldd "$bb" | awk '/=>/ { print $3 } /^\t\// { print $1 }')"
  for lib in $libs /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libnss_dns.so.2; do
    [ -e "$lib" ] || continue
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
  printf 'passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\n' > "$rootfs/etc/nsswitch.conf"
  echo 'root:x:0:0:root:/root:/bin/sh' > "$rootfs/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >> "$rootfs/etc/passwd"
  echo 'root:x:0:' > "$rootfs/etc/group"
  echo 'nogroup:x:65534:' >> "$rootfs/etc/group"
}
