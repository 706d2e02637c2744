#!/usr/bin/env bash
# Builds the control-plane image for `minik8s init --static-control-plane`: the `minik8s`
# binary BIN (stripped of debug info) with the shared libraries it loads, as a docker
# archive DIR/control-plane.tar tagged docker.io/minik8s/control-plane:<hash of BIN>, so an
# image never runs a binary other than the one it was built from. Idempotent: keeps an
# archive built from the same binary.
#   hack/control-plane-image.sh [BIN] [DIR]   (defaults: target/release/minik8s, /var/lib/minik8s/images)
source "$(dirname "$0")/lib.sh"
BIN="$(realpath "${1:-$ROOT/target/release/minik8s}")"
DIR="$(realpath -m "${2:-/var/lib/minik8s/images}")"
[ -x "$BIN" ] || die "$BIN is not a built minik8s binary (cargo build --release -p minik8s)"
for tool in umoci skopeo objcopy; do
  command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh --node"
done
tag="$(sha256sum "$BIN" | cut -c1-12)"
mkdir -p "$DIR"
if [ -s "$DIR/control-plane.tar" ] && [ "$(cat "$DIR/control-plane.tag" 2>/dev/null)" = "$tag" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
log "building the control-plane image from $BIN"
umoci init --layout layout
umoci new --image layout:cp
umoci unpack --rootless --image layout:cp b >/dev/null
mkdir -p b/rootfs/usr/local/bin b/rootfs/etc b/rootfs/tmp
objcopy --strip-debug "$BIN" b/rootfs/usr/local/bin/minik8s
for lib in $(ldd "$BIN" | awk '/=>/ && $3 ~ /^\// { print $3 } /^\t\// { print $1 }'); do
  mkdir -p "b/rootfs$(dirname "$lib")"
  cp -L "$lib" "b/rootfs$lib"
done
echo 'root:x:0:0:root:/root:/bin/sh' > b/rootfs/etc/passwd
printf 'hosts: files dns\n' > b/rootfs/etc/nsswitch.conf
umoci repack --image layout:cp b
umoci config --image layout:cp --config.entrypoint /usr/local/bin/minik8s --os linux --architecture amd64
skopeo copy -q oci:layout:cp "docker-archive:$DIR/control-plane.tar.tmp:docker.io/minik8s/control-plane:$tag"
mv "$DIR/control-plane.tar.tmp" "$DIR/control-plane.tar"
echo "$tag" > "$DIR/control-plane.tag"
log "control-plane image docker.io/minik8s/control-plane:$tag in $DIR/control-plane.tar"
