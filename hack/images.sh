#!/usr/bin/env bash
# Builds the node's local images without a registry (node recipe): a static `pause` and a
# `busybox` (with an httpd docroot at /www) as docker archives in DIR (default
# target/images): pause.tar (registry.k8s.io/pause:3.9-local), busybox.tar
# (docker.io/library/busybox:latest) and function-python.tar
# (docker.io/minik8s/function-python:py-<hash of its server and base>, the Function runtime) and
# knative-helloworld.tar (ghcr.io/knative/helloworld-go:latest, Knative's sample). Idempotent:
# keeps archives that exist.
#
# busybox is built from Debian's busybox source package with upstream's default
# configuration (as the upstream busybox image is): Debian's own binaries leave out applet
# options users reach for (`wget -T` segfaults in Debian's build, which lacks the timeout
# feature), and a static glibc binary cannot load the name-service modules its resolver
# needs. The image carries the dynamic binary with its glibc, the NSS modules and an
# /etc/nsswitch.conf, like upstream's busybox:glibc.
source "$(dirname "$0")/lib.sh"
DIR="$(realpath -m "${1:-$ROOT/target/images}")"
mkdir -p "$DIR"
tag="py-$(cat "$ROOT/serverless-crd/runtime/server.py" "$ROOT/serverless-crd/runtime/base.py" | sha256sum | cut -c1-12)"
hello_src="$ROOT/conformance/knative/helloworld/main.go"
hello_tag="$(sha256sum "$hello_src" | cut -c1-12)"
# Knative's getting-started image (its helloworld-go sample's behaviour, our source): a static
# Go binary alone in its image, under the name Knative's manifests use.
if ! [ -s "$DIR/knative-helloworld.tar" ] || [ "$(cat "$DIR/knative-helloworld.tag" 2>/dev/null)" != "$hello_tag" ]; then
  for tool in umoci skopeo go; do
    command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh --node"
  done
  hello_work="$(mktemp -d)"
  (
    cd "$hello_work"
    CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags=-s -o hello "$hello_src"
    umoci init --layout layout
    umoci new --image layout:helloworld
    umoci unpack --rootless --image layout:helloworld b-hello >/dev/null
    cp hello b-hello/rootfs/hello
    umoci repack --image layout:helloworld b-hello
    umoci config --image layout:helloworld --config.entrypoint /hello --config.exposedports 8080/tcp \
      --os linux --architecture amd64
    skopeo copy -q oci:layout:helloworld "docker-archive:$DIR/knative-helloworld.tar.tmp:ghcr.io/knative/helloworld-go:latest"
  ) || { rm -rf "$hello_work"; die "building the Knative sample image failed"; }
  rm -rf "$hello_work"
  mv "$DIR/knative-helloworld.tar.tmp" "$DIR/knative-helloworld.tar"
  echo "$hello_tag" > "$DIR/knative-helloworld.tag"
fi
if [ -s "$DIR/pause.tar" ] && [ -s "$DIR/busybox.tar" ] && [ -s "$DIR/function-python.tar" ] \
   && [ "$(cat "$DIR/function-python.tag" 2>/dev/null)" = "$tag" ]; then
  exit 0
fi
for tool in umoci skopeo gcc make bzip2; do
  command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh --node"
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
log "building the pause and busybox images into $DIR"
cat > pause.c <<'C'
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void onterm(int s){(void)s;_exit(0);}
static void onchld(int s){(void)s;while(waitpid(-1,0,WNOHANG)>0);}
int main(void){signal(SIGINT,onterm);signal(SIGTERM,onterm);signal(SIGCHLD,onchld);for(;;)pause();}
C
gcc -static -Os -o pause pause.c && strip pause
umoci init --layout layout
umoci new --image layout:pause
umoci unpack --rootless --image layout:pause b-pause >/dev/null
cp pause b-pause/rootfs/pause
umoci repack --image layout:pause b-pause
umoci config --image layout:pause --config.entrypoint /pause --config.user 65535:65535 --os linux --architecture amd64
umoci new --image layout:busybox
umoci unpack --rootless --image layout:busybox b-bb >/dev/null
mkdir -p b-bb/rootfs/www
busybox_rootfs b-bb/rootfs
echo hello > b-bb/rootfs/www/index.html
umoci repack --image layout:busybox b-bb
umoci config --image layout:busybox --config.cmd /bin/sh --config.env PATH=/bin:/usr/bin:/sbin --os linux --architecture amd64
# The Python function runtime: Debian's own Python packages unpacked into a rootfs, the
# shared libraries its binary and extension modules load, and the invocation server.
umoci new --image layout:function-python
umoci unpack --rootless --image layout:function-python b-py >/dev/null
mkdir -p debs && (cd debs && apt-get download -qq python3.11-minimal libpython3.11-minimal libpython3.11-stdlib 2>/dev/null \
  || { apt-get update -qq && apt-get download -qq python3.11-minimal libpython3.11-minimal libpython3.11-stdlib; })
for deb in debs/*.deb; do dpkg -x "$deb" b-py/rootfs; done
libs="$( { ldd b-py/rootfs/usr/bin/python3.11; for so in b-py/rootfs/usr/lib/python3.11/lib-dynload/*.so; do ldd "$so"; done; } \
  | awk '/=>/ && $3 ~ /^\// { print $3 } /^\t\// { print $1 }' | sort -u)"
for lib in $libs; do
  [ -e "b-py/rootfs$lib" ] && continue
  mkdir -p "b-py/rootfs$(dirname "$lib")"
  cp -L "$lib" "b-py/rootfs$lib"
done
mkdir -p b-py/rootfs/runtime b-py/rootfs/code b-py/rootfs/tmp b-py/rootfs/etc
cp "$ROOT/serverless-crd/runtime/server.py" "$ROOT/serverless-crd/runtime/base.py" b-py/rootfs/runtime/
# Byte-compiled once here (Debian compiles in its postinst, which an unpacked rootfs never
# runs): imports at a cold start read .pyc files instead of compiling the standard library.
chroot b-py/rootfs /usr/bin/python3.11 -m compileall -q --invalidation-mode unchecked-hash \
  /usr/lib/python3.11 /runtime >/dev/null
echo 'root:x:0:0:root:/root:/bin/sh' > b-py/rootfs/etc/passwd
echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >> b-py/rootfs/etc/passwd
umoci repack --image layout:function-python b-py
umoci config --image layout:function-python --config.entrypoint /usr/bin/python3.11 \
  --config.cmd=-u --config.cmd=/runtime/server.py --config.env PYTHONDONTWRITEBYTECODE=1 \
  --config.exposedports 8080/tcp --os linux --architecture amd64
# Tagged by the hash of the invocation server and the base, as the Function controller names it, so a node
# never runs a stale runtime under a reused tag.
tag="py-$(cat "$ROOT/serverless-crd/runtime/server.py" "$ROOT/serverless-crd/runtime/base.py" | sha256sum | cut -c1-12)"
skopeo copy -q oci:layout:function-python "docker-archive:$DIR/function-python.tar.tmp:docker.io/minik8s/function-python:$tag"
skopeo copy -q oci:layout:pause "docker-archive:$DIR/pause.tar.tmp:registry.k8s.io/pause:3.9-local"
skopeo copy -q oci:layout:busybox "docker-archive:$DIR/busybox.tar.tmp:docker.io/library/busybox:latest"
mv "$DIR/pause.tar.tmp" "$DIR/pause.tar"
mv "$DIR/busybox.tar.tmp" "$DIR/busybox.tar"
mv "$DIR/function-python.tar.tmp" "$DIR/function-python.tar"
echo "$tag" > "$DIR/function-python.tag"
log "images ready in $DIR"
