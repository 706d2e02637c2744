#!/usr/bin/env bash
# The images a suite's [Conformance] specs run, built here without a registry (no registry is
# reachable), as docker archives WORK/images/e2e-*.tar, named as WORK/repo-list.yaml remaps them
# (KUBE_TEST_REPO_LIST): every registry but the deliberately invalid, private and authenticated
# ones goes to docker.io/<name>, which a minik8s node pulls from its local registry.
#   bash hack/conformance-images.sh PROFILE WORK BIN SRC
# PROFILE is v1.34 (hack/conformance.sh) or v1.20 (hack/conformance-1.20.sh); BIN holds that
# release's agnhost, nnp and sample-apiserver binaries; SRC is its source tree (the module
# folder of k8s.io/kubernetes, or the unpacked v1.20.2 source), for the files images carry.
#
# What each is, and where it stands in for upstream's (`e2e.test --list-images` names them):
# - agnhost          upstream's agnhost binary (built from the same release) on the node's
#                    busybox (shell, wget, ip), with Debian's curl, dig and OpenBSD nc as
#                    upstream's alpine image has them; no iperf or coredns.
# - busybox          the node's busybox image.
# - pause            the node's static pause.
# - httpd, nginx     stand-ins: busybox httpd on port 80 serving the image's usual docroot,
#                    stopping on SIGTERM as upstream's do.
# - nonroot          busybox run as uid 1234, as upstream's.
# - nonewprivs       upstream's nnp (Go), setuid root, on busybox.
# - kitten, nautilus agnhost test-webserver serving the images' html folders, as upstream's.
# - jessie-dnsutils  busybox with Debian's dig (bind9-dnsutils) and its libraries.
# - sample-apiserver the release's k8s.io/sample-apiserver, on busybox.
# - etcd             Debian's etcd binary and the libraries it links, as /usr/local/bin/etcd.
source "$(dirname "$0")/lib.sh"
PROFILE="${1:?PROFILE}"
WORK="$(realpath -m "${2:?WORK}")"
BIN="$(realpath -m "${3:?BIN}")"
SRC="$(realpath -m "${4:?SRC}")"
OUT="$WORK/images"
mkdir -p "$OUT"
# Each image's reference after the remapping, by profile (test/utils/image/manifest.go).
case "$PROFILE" in
  v1.34)
    cat > "$WORK/repo-list.yaml" <<'EOF'
dockerLibraryRegistry: docker.io/library
promoterE2eRegistry: docker.io/e2e-promoter
buildImageRegistry: docker.io/build-image
gcEtcdRegistry: docker.io/gc
gcRegistry: docker.io/gc
sigStorageRegistry: docker.io/sig-storage
cloudProviderGcpRegistry: docker.io/cloud-provider-gcp
EOF
    REF_AGNHOST=docker.io/e2e-promoter/agnhost:2.56
    REF_BUSYBOX=docker.io/e2e-promoter/busybox:1.37.0-1
    # The specs also name an older busybox in places.
    REF_BUSYBOX_MORE=(docker.io/e2e-promoter/busybox:1.36.1-1)
    REF_PAUSE=docker.io/gc/pause:3.10.1
    WEB=(httpd:docker.io/e2e-promoter/httpd:2.4.38-4:/usr/local/apache2/htdocs
         httpd:docker.io/e2e-promoter/httpd:2.4.39-4:/usr/local/apache2/htdocs
         nginx:docker.io/e2e-promoter/nginx:1.14-4:/usr/share/nginx/html
         nginx:docker.io/e2e-promoter/nginx:1.15-4:/usr/share/nginx/html)
    REF_NONROOT=docker.io/e2e-promoter/nonroot:1.4
    REF_NONEWPRIVS=docker.io/e2e-promoter/nonewprivs:1.3
    REF_PIC=docker.io/e2e-promoter/NAME:1.7
    REF_DNSUTILS=docker.io/e2e-promoter/jessie-dnsutils:1.7
    REF_SAMPLE=docker.io/e2e-promoter/sample-apiserver:1.29.2
    REF_ETCD=docker.io/gc/etcd:3.6.4-0
    ;;
  v1.20)
    cat > "$WORK/repo-list.yaml" <<'EOF'
dockerLibraryRegistry: docker.io/library
e2eRegistry: docker.io/e2e
e2eVolumeRegistry: docker.io/e2e-volume
promoterE2eRegistry: docker.io/e2e-promoter
buildImageRegistry: docker.io/build-image
gcEtcdRegistry: docker.io/gc
gcRegistry: docker.io/gc
sigStorageRegistry: docker.io/sig-storage
gcrReleaseRegistry: docker.io/gcr-release
dockerGluster: docker.io/gluster
sampleRegistry: docker.io/e2e
EOF
    REF_AGNHOST=docker.io/e2e-promoter/agnhost:2.21
    REF_BUSYBOX=docker.io/library/busybox:1.29
    REF_BUSYBOX_MORE=()
    REF_PAUSE=docker.io/gc/pause:3.2
    WEB=(httpd:docker.io/library/httpd:2.4.38-alpine:/usr/local/apache2/htdocs
         httpd:docker.io/library/httpd:2.4.39-alpine:/usr/local/apache2/htdocs
         nginx:docker.io/library/nginx:1.14-alpine:/usr/share/nginx/html
         nginx:docker.io/library/nginx:1.15-alpine:/usr/share/nginx/html)
    REF_NONROOT=docker.io/e2e/nonroot:1.0
    REF_NONEWPRIVS=docker.io/e2e/nonewprivs:1.0
    REF_PIC=docker.io/e2e/NAME:1.0
    REF_DNSUTILS=docker.io/e2e/jessie-dnsutils:1.0
    REF_SAMPLE=docker.io/e2e/sample-apiserver:1.17
    REF_ETCD=docker.io/gc/etcd:3.4.13-0
    ;;
  *) die "unknown profile $PROFILE (known: v1.34, v1.20)" ;;
esac
for b in agnhost nnp sample-apiserver; do
  [ -x "$BIN/$b" ] || die "$BIN/$b is missing (the suite's build makes it)"
done
# Bump when the set of images changes, so an older set is rebuilt.
VERSION="7-$PROFILE"
[ "$(head -1 "$OUT/.done" 2>/dev/null)" = "$VERSION" ] && exit 0
for tool in umoci skopeo gcc; do
  command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh --node"
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
umoci init --layout layout

# image NAME REF [umoci config options…]: packs rootfs b-NAME (made by the caller after
# `new NAME`) into OUT/NAME.tar tagged REF.
new() { umoci new --image "layout:$1"; umoci unpack --rootless --image "layout:$1" "b-$1" >/dev/null; }
image() {
  local name="$1" ref="$2"
  shift 2
  umoci repack --image "layout:$name" "b-$name"
  umoci config --image "layout:$name" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "$@"
  # (e2e- prefixed: the node's own archives sit beside them in its images folder)
  rm -f "$OUT/e2e-$name.tar"
  skopeo copy -q "oci:layout:$name" "docker-archive:$OUT/e2e-$name.tar:$ref"
}

# debs_into ROOTFS "PKGS" BIN…: unpacks Debian's packages PKGS into ROOTFS and copies the
# libraries each BIN (a path inside ROOTFS) loads that the packages lack, from the host
# (packages the host lacks them from are unpacked first).
debs_into() {
  local rootfs="$1" bin lib pkg dep libdir seen=" "
  local -a queue
  read -r -a queue <<<"$2"
  shift 2
  mkdir -p debs
  # The packages, and (recursively) those of their dependencies the host lacks: the host's
  # own libraries are copied below, from what each binary loads.
  while [ "${#queue[@]}" -gt 0 ]; do
    pkg="${queue[0]}"
    queue=("${queue[@]:1}")
    case "$seen" in *" $pkg "*) continue ;; esac
    seen="$seen$pkg "
    ls debs/"$pkg"_*.deb >/dev/null 2>&1 || (cd debs && { apt-get download -qq "$pkg" 2>/dev/null || { apt-get update -qq && apt-get download -qq "$pkg"; }; }) || continue
    dpkg -x debs/"$pkg"_*.deb "$rootfs"
    for dep in $(dpkg-deb -f debs/"$pkg"_*.deb Depends | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//' | tr -d ' '); do
      dpkg -s "$dep" >/dev/null 2>&1 || queue+=("$dep")
    done
  done
  libdir="$rootfs/usr/lib/x86_64-linux-gnu"
  for bin in "$@"; do
    [ -e "$rootfs$bin" ] || continue
    for lib in $(LD_LIBRARY_PATH="$libdir" ldd "$rootfs$bin" | awk '/=>/ && $3 ~ /^\// { print $3 } /^\t\/lib/ { print $1 }'); do
      case "$lib" in "$rootfs"/*|"$work"/*) continue ;; esac
      [ -e "$rootfs$lib" ] && continue
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
    if LD_LIBRARY_PATH="$libdir" ldd "$rootfs$bin" | grep -q "not found"; then
      die "$bin in $rootfs still lacks: $(LD_LIBRARY_PATH="$libdir" ldd "$rootfs$bin" | grep 'not found' | tr '\n' ' ')"
    fi
  done
}

# host_bin ROOTFS PATH…: copies host binaries (and the libraries they load) into ROOTFS.
host_bin() {
  local rootfs="$1" bin lib
  shift
  for bin in "$@"; do
    mkdir -p "$rootfs$(dirname "$bin")"
    cp -L "$bin" "$rootfs$bin"
    for lib in $(ldd "$bin" | awk '/=>/ && $3 ~ /^\// { print $3 } /^\t\/lib/ { print $1 }'); do
      [ -e "$rootfs$lib" ] && continue
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
  done
}

log "agnhost, busybox, pause"
new agnhost
busybox_rootfs b-agnhost/rootfs
cp "$BIN/agnhost" b-agnhost/rootfs/agnhost
ln -s agnhost b-agnhost/rootfs/agnhost-2
# upstream's image adds curl, bind-tools (dig, nslookup, host) and OpenBSD's nc (specs run
# `nc -zv -t`, busybox's has no -t).
debs_into b-agnhost/rootfs "curl libcurl4 netcat-openbsd bind9-dnsutils bind9-host bind9-libs" /usr/bin/curl /bin/nc.openbsd /usr/bin/dig /usr/bin/nslookup /usr/bin/host
ln -sf nc.openbsd b-agnhost/rootfs/bin/nc
host_bin b-agnhost/rootfs /usr/bin/getent
mkdir -p b-agnhost/rootfs/uploads
cp "$SRC/test/images/agnhost/porter/localhost.crt" "$SRC/test/images/agnhost/porter/localhost.key" b-agnhost/rootfs/
image agnhost "$REF_AGNHOST" --config.entrypoint /agnhost --config.cmd pause

new busybox
busybox_rootfs b-busybox/rootfs
image busybox "$REF_BUSYBOX" --config.cmd sh
i=0
for ref in "${REF_BUSYBOX_MORE[@]}"; do
  i=$((i + 1))
  new "busybox-$i"
  busybox_rootfs "b-busybox-$i/rootfs"
  image "busybox-$i" "$ref" --config.cmd sh
done

cat > pause.c <<'C'
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void onterm(int s){(void)s;_exit(0);}
static void onchld(int s){(void)s;while(waitpid(-1,0,WNOHANG)>0);}
int main(void){signal(SIGINT,onterm);signal(SIGTERM,onterm);signal(SIGCHLD,onchld);for(;;)pause();}
C
gcc -static -Os -o pause pause.c && strip pause
new pause
cp pause b-pause/rootfs/pause
image pause "$REF_PAUSE" --config.entrypoint /pause

log "httpd and nginx stand-ins"
for web in "${WEB[@]}"; do
  IFS=: read -r name repo tag root <<<"$web"
  n="$name-${tag//./-}"
  new "$n"
  busybox_rootfs "b-$n/rootfs"
  mkdir -p "b-$n/rootfs$root"
  if [ "$name" = httpd ]; then
    echo '<html><body><h1>It works!</h1></body></html>' > "b-$n/rootfs$root/index.html"
  else
    echo '<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>' > "b-$n/rootfs$root/index.html"
  fi
  # Under a shell that stops on SIGTERM, as upstream's httpd and nginx do: busybox httpd as
  # PID 1 ignores it and a deleted pod would wait out its whole grace period.
  image "$n" "$repo:$tag" --config.cmd sh --config.cmd=-c \
    --config.cmd="trap 'exit 0' TERM INT; httpd -f -p 80 -h $root & wait" --config.exposedports 80/tcp
done

log "nonroot, nonewprivs, kitten, nautilus"
new nonroot
busybox_rootfs b-nonroot/rootfs
image nonroot "$REF_NONROOT" --config.user 1234 --config.cmd sh

new nonewprivs
busybox_rootfs b-nonewprivs/rootfs
mkdir -p b-nonewprivs/rootfs/usr/local/bin
cp "$BIN/nnp" b-nonewprivs/rootfs/usr/local/bin/nnp
chmod 4755 b-nonewprivs/rootfs/usr/local/bin/nnp
image nonewprivs "$REF_NONEWPRIVS" --config.cmd nnp

for pic in kitten nautilus; do
  new "$pic"
  busybox_rootfs "b-$pic/rootfs"
  cp "$BIN/agnhost" "b-$pic/rootfs/agnhost"
  cp "$SRC/test/images/$pic/html/"* "b-$pic/rootfs/"
  image "$pic" "${REF_PIC/NAME/$pic}" --config.entrypoint /agnhost --config.cmd test-webserver
done

log "jessie-dnsutils (Debian's dig)"
new dnsutils
busybox_rootfs b-dnsutils/rootfs
debs_into b-dnsutils/rootfs "bind9-dnsutils bind9-libs" /usr/bin/dig
host_bin b-dnsutils/rootfs /usr/bin/getent
image dnsutils "$REF_DNSUTILS" --config.cmd sh

log "sample-apiserver and etcd (Debian's)"
new sampleapiserver
busybox_rootfs b-sampleapiserver/rootfs
cp "$BIN/sample-apiserver" b-sampleapiserver/rootfs/kube-sample-apiserver
image sampleapiserver "$REF_SAMPLE" --config.entrypoint /kube-sample-apiserver

new etcd
busybox_rootfs b-etcd/rootfs
etcd_bin="$(command -v etcd)" || die "etcd is missing: run hack/install-deps.sh --node"
mkdir -p b-etcd/rootfs/usr/local/bin
cp -L "$etcd_bin" b-etcd/rootfs/usr/local/bin/etcd
for lib in $(ldd "$etcd_bin" | awk '/=>/ && $3 ~ /^\// { print $3 } /^\t\/lib/ { print $1 }'); do
  mkdir -p "b-etcd/rootfs$(dirname "$lib")"
  cp -L "$lib" "b-etcd/rootfs$lib"
done
image etcd "$REF_ETCD" --config.cmd /usr/local/bin/etcd

echo "$VERSION" > "$OUT/.done"
date >> "$OUT/.done"
log "conformance images ready in $OUT"
