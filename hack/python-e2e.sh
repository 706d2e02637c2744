#!/usr/bin/env bash
# The official Python client's own e2e tests (its repository's `kubernetes/e2e_test`) against a
# `minik8s up` cluster of their own (data in target/python-e2e, port 6449, torn down after).
#
#   bash hack/python-e2e.sh E2E_DIR [PYTEST ARGS…]
#
# E2E_DIR is the repository's `kubernetes/e2e_test` folder at the tag of the client version
# pinned below (the folder is not in the PyPI package: copy it from a checkout of
# kubernetes-client/python). Not part of CI: it needs that checkout.
#
# Stand-in images, since no registry is reachable (as hack/conformance-images-1.20.sh's): `python`
# is the Function runtime's Debian Python with `python` on its PATH, `nginx` and
# `nginx:1.15.4` the conformance nginx stand-in (busybox httpd on port 80), and
# `k8s.gcr.io/pause:2.0` the node's pause image.
source "$(dirname "$0")/lib.sh"
[ $# -ge 1 ] || die "usage: hack/python-e2e.sh E2E_DIR [PYTEST ARGS…]"
E2E="$(cd "$1" && pwd)"
shift
WORK="$ROOT/target/python-e2e"
DATA="$WORK/cluster"
VENV="$WORK/venv"
PINS=(kubernetes==37.0.2 pytest==8.3.5)

if [ "$(cat "$VENV/.pins" 2>/dev/null)" != "${PINS[*]}" ]; then
  rm -rf "$VENV"
  log "installing ${PINS[*]} into $VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
  echo "${PINS[*]}" > "$VENV/.pins"
fi

# A fresh cluster every run; built images are kept.
if [ -d "$DATA" ]; then
  DATA_DIR="$DATA" "$ROOT/hack/down.sh" >/dev/null 2>&1 || true
  find "$DATA" -mindepth 1 -maxdepth 1 ! -name images -exec rm -rf {} +
fi
"$ROOT/hack/images.sh" "$DATA/images" >/dev/null
[ -s "$ROOT/target/conformance-1.20/images/e2e-nginx-1-15-alpine.tar" ] \
  || die "the nginx stand-in is missing: run hack/conformance-1.20.sh build first"

# retag SRC_ARCHIVE OUT_ARCHIVE REF: the image of SRC_ARCHIVE under REF.
retag() {
  local tmp
  tmp="$(mktemp -d)"
  skopeo copy -q "docker-archive:$1" "oci:$tmp/layout:img"
  rm -f "$2"
  skopeo copy -q "oci:$tmp/layout:img" "docker-archive:$2:$3"
  rm -rf "$tmp"
}
if [ ! -s "$DATA/images/python.tar" ]; then
  log "python stand-in"
  tmp="$(mktemp -d)"
  skopeo copy -q "docker-archive:$DATA/images/function-python.tar" "oci:$tmp/layout:python"
  umoci unpack --rootless --image "$tmp/layout:python" "$tmp/b" >/dev/null
  mkdir -p "$tmp/b/rootfs/usr/local/bin"
  ln -sf /usr/bin/python3.11 "$tmp/b/rootfs/usr/local/bin/python"
  umoci repack --image "$tmp/layout:python" "$tmp/b"
  umoci config --image "$tmp/layout:python" --clear=config.entrypoint --clear=config.cmd \
    --config.cmd python --config.env PATH=/usr/local/bin:/usr/bin:/bin
  skopeo copy -q "oci:$tmp/layout:python" "docker-archive:$DATA/images/python.tar:docker.io/library/python:latest"
  rm -rf "$tmp"
fi
nginx="$ROOT/target/conformance-1.20/images/e2e-nginx-1-15-alpine.tar"
[ -s "$DATA/images/nginx.tar" ] || retag "$nginx" "$DATA/images/nginx.tar" docker.io/library/nginx:latest
[ -s "$DATA/images/nginx-1-15-4.tar" ] || retag "$nginx" "$DATA/images/nginx-1-15-4.tar" docker.io/library/nginx:1.15.4
[ -s "$DATA/images/pause-2.tar" ] || retag "$DATA/images/pause.tar" "$DATA/images/pause-2.tar" k8s.gcr.io/pause:2.0

log "building minik8s (release)"
cargo build --release -p minik8s --bin minik8s --quiet
log "starting minik8s (data in $DATA)"
"$ROOT/target/release/minik8s" up --data-dir "$DATA" --bind 0.0.0.0 --port 6449 \
  --registry 127.0.0.1:5059 --no-functions --router 127.0.0.1:8090 >"$WORK/minik8s.log" 2>&1 &
CLUSTER_PID=$!
trap 'kill -TERM "$CLUSTER_PID" 2>/dev/null; wait "$CLUSTER_PID" 2>/dev/null; DATA_DIR="$DATA" "$ROOT/hack/down.sh" >/dev/null 2>&1 || true' EXIT INT TERM
export KUBECONFIG="$DATA/admin.kubeconfig"
for _ in $(seq 120); do kubectl get nodes 2>/dev/null | grep -q ' Ready' && break; sleep 1; done
kubectl get nodes | grep -q ' Ready' || die "the node did not become Ready (see $WORK/minik8s.log)"
# The tests import themselves as `kubernetes.e2e_test`: they go into the installed package.
site="$("$VENV/bin/python" -c 'import kubernetes, os; print(os.path.dirname(kubernetes.__file__))')"
rm -rf "$site/e2e_test"
cp -r "$E2E" "$site/e2e_test"
log "running the client's e2e tests"
# They read their manifests from kubernetes/e2e_test/test_yaml, relative to the working folder.
cd "$(dirname "$site")"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$site/e2e_test" "$@"
