#!/usr/bin/env bash
# The older profile: upstream's v1.20.2 e2e conformance suite against a `minik8s up` cluster
# (hack/conformance.sh runs the current one; PROFILE=v1.20 there runs this).
#
#   bash hack/conformance-1.20.sh build        fetch and build e2e.test, ginkgo, kubectl 1.20 and the images
#   bash hack/conformance-1.20.sh run [FOCUS]  bring up a cluster, run the [Conformance] specs, tear it down
#   bash hack/conformance-1.20.sh report DIR   per-SIG pass counts of a finished run's JUnit files
#
# Everything comes from Debian's packages (../shared/conformance-notes.md): the source is
# bookworm's `kubernetes` source package (upstream's v1.20.2 `git archive`, vendor/ included,
# Debian's patches not applied), Go 1.15 is bullseye's golang-1.15-go. Both are fetched with a
# private apt state (sources, lists and cache under WORK) and unpacked there: nothing is
# installed system-wide and the system's apt configuration is not touched.
# WORK (default target/conformance) holds the tree, the Go caches and the results (~2.5 GB).
# It takes long (build ~10 min, the parallel pass about an hour on 2 cores): not part of CI.
source "$(dirname "$0")/lib.sh"
need_root
WORK="$(realpath -m "${WORK:-$ROOT/target/conformance-1.20}")"
SRC="$WORK/src/kubernetes-1.20.2"
GO="$WORK/go1.15/usr/lib/go-1.15/bin/go"
OUT="$WORK/bin"
mkdir -p "$WORK" "$OUT"

# apt with a private state: its own sources, lists, cache and status.
apt_private() {
  local state="$WORK/apt"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc/preferences.d"
  # The machine's own Debian mirror, as apt's sources name it (deb822 or one-line format).
  local mirror
  mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 ~ /\/debian\/?$/ { print $2; exit }')"
  [ -n "$mirror" ] || mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }')"
  [ -n "$mirror" ] || die "no Debian mirror found in apt's sources"
  printf 'deb %s bullseye main\ndeb-src %s bookworm main\n' "$mirror" "$mirror" > "$state/sources.list"
  : > "$state/status"
  apt-get -q -o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts=- \
    -o Dir::Etc::Preferences="$state/etc/preferences" -o Dir::Etc::PreferencesParts="$state/etc/preferences.d" \
    -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache" -o Dir::State::Status="$state/status" \
    -o APT::Sandbox::User=root -o Debug::NoLocking=1 "$@"
}

fetch() {
  command -v rsync >/dev/null || { log "installing rsync (upstream's make copies with it)"; apt-get install -y -q rsync >/dev/null; }
  if [ ! -x "$GO" ]; then
    log "fetching Go 1.15 (bullseye's golang-1.15-go) into $WORK/go1.15"
    apt_private update >/dev/null
    (cd "$WORK" && apt_private download golang-1.15-go golang-1.15-src >/dev/null)
    for deb in "$WORK"/golang-1.15-*.deb; do dpkg-deb -x "$deb" "$WORK/go1.15"; done
    rm -f "$WORK"/golang-1.15-*.deb
  fi
  "$GO" version >&2
  if [ ! -d "$SRC" ]; then
    log "fetching bookworm's kubernetes source package (v1.20.2)"
    apt_private update >/dev/null
    mkdir -p "$WORK/src"
    (cd "$WORK/src" && apt_private source --download-only kubernetes >/dev/null)
    local orig
    orig="$(ls "$WORK"/src/kubernetes_*.orig.tar.* | head -1)"
    mkdir -p "$SRC"
    tar -xf "$orig" -C "$SRC" --strip-components=1
  fi
}

go_env() {
  export GOROOT="$WORK/go1.15/usr/lib/go-1.15" GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache"
  export GOFLAGS=-mod=vendor GO111MODULE=on CGO_ENABLED=0 PATH="$GOROOT/bin:$PATH"
}

build() {
  fetch
  go_env
  cd "$SRC"
  local ldflags="-X k8s.io/component-base/version.gitVersion=v1.20.2 -X k8s.io/component-base/version.gitCommit=faecb196815e248d3ecfb03c680a4507229c2a56 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=20"
  # The specs' manifests and kubectl's translations, compiled in as upstream's make does.
  # (hack/generate-bindata.sh's two go-bindata runs, without its GOPATH setup.)
  if [ ! -f test/e2e/generated/bindata.go ]; then
    log "generating bindata"
    go build -o "$OUT/go-bindata" ./vendor/github.com/go-bindata/go-bindata/go-bindata
    "$OUT/go-bindata" -nometadata -o test/e2e/generated/bindata.go -pkg generated \
      -ignore .jpg -ignore .png -ignore .md -ignore 'BUILD(\.bazel)?' \
      test/conformance/testdata/... test/e2e/testing-manifests/... \
      test/e2e_node/testing-manifests/... test/images/... test/fixtures/...
    "$OUT/go-bindata" -nometadata -nocompress -o staging/src/k8s.io/kubectl/pkg/generated/bindata.go \
      -pkg generated -ignore .jpg -ignore .png -ignore .md -ignore 'BUILD(\.bazel)?' translations/...
  fi
  [ -x "$OUT/e2e.test" ] || { log "building e2e.test"; go test -c -o "$OUT/e2e.test" -ldflags "$ldflags" ./test/e2e; }
  [ -x "$OUT/ginkgo" ] || { log "building ginkgo"; go build -o "$OUT/ginkgo" ./vendor/github.com/onsi/ginkgo/ginkgo; }
  [ -x "$OUT/kubectl" ] || { log "building kubectl 1.20"; go build -o "$OUT/kubectl" -ldflags "$ldflags" ./cmd/kubectl; }
  [ -x "$OUT/agnhost" ] || { log "building agnhost"; go build -o "$OUT/agnhost" ./test/images/agnhost; }
  [ -x "$OUT/nnp" ] || { log "building nnp"; go build -o "$OUT/nnp" ./test/images/nonewprivs; }
  if [ ! -x "$OUT/sample-apiserver" ]; then
    # Its main package is not vendored (its libraries are): the same main.go, built inside the
    # kubernetes module.
    log "building sample-apiserver"
    mkdir -p cmd/e2e-sample-apiserver
    cp staging/src/k8s.io/sample-apiserver/main.go cmd/e2e-sample-apiserver/main.go
    go build -o "$OUT/sample-apiserver" ./cmd/e2e-sample-apiserver
  fi
  "$ROOT/hack/conformance-images.sh" v1.20 "$WORK" "$OUT" "$SRC"
  true
}

# One report for both profiles: hack/conformance.sh's.
report() {
  PROFILE=v1.34 "$ROOT/hack/conformance.sh" report "$1"
}

run() {
  local focus="${1:-\[Conformance\]}"
  [ -x "$OUT/e2e.test" ] || build
  local data="$WORK/cluster" results
  results="$WORK/results/$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$results"
  # Every run starts from an empty cluster: objects a failed spec left behind
  # (PriorityClasses, pods, namespaces) must not decide the next run's results.
  # The built images are kept.
  if [ -d "$data" ]; then
    DATA_DIR="$data" "$ROOT/hack/down.sh" >/dev/null 2>&1 || true
    find "$data" -mindepth 1 -maxdepth 1 ! -name images -exec rm -rf {} +
  fi
  DATA_DIR="$data" PORT=6448 "$ROOT/hack/images.sh" "$data/images" >/dev/null
  cp "$WORK"/images/e2e-*.tar "$data/images/"
  log "starting minik8s (data in $data, results in $results)"
  cargo build --release -p minik8s --bin minik8s --quiet
  # Bound to every address: pods (the sample apiserver among them) reach the API through the
  # `kubernetes` Service, whose endpoint is the advertised node address.
  "$ROOT/target/release/minik8s" up --data-dir "$data" --bind 0.0.0.0 --port 6448 --registry 127.0.0.1:5058 \
    --no-functions --router 127.0.0.1:8089 >"$results/minik8s.log" 2>&1 &
  # Globals: the EXIT trap runs after this function's locals are gone.
  CLUSTER_PID=$!
  CLUSTER_DATA="$data"
  trap 'kill -TERM "$CLUSTER_PID" 2>/dev/null; wait "$CLUSTER_PID" 2>/dev/null; DATA_DIR="$CLUSTER_DATA" "$ROOT/hack/down.sh" >/dev/null 2>&1 || true' EXIT INT TERM
  export KUBECONFIG="$data/admin.kubeconfig"
  for _ in $(seq 120); do kubectl get nodes 2>/dev/null | grep -q ' Ready' && break; sleep 1; done
  export KUBE_TEST_REPO_LIST="$WORK/repo-list.yaml"
  local skip='\[Serial\]|\[Disruptive\]|\[Flaky\]'
  log "parallel pass ($focus, 6 nodes)"
  "$OUT/ginkgo" -nodes=6 -v -focus="$focus" -skip="$skip" "$OUT/e2e.test" -- \
    --provider=skeleton --kubeconfig="$KUBECONFIG" --kubectl-path="$OUT/kubectl" \
    --disable-log-dump --repo-root="$SRC" --report-dir="$results" \
    --e2e-verify-service-account=false >"$results/parallel.log" 2>&1 || true
  log "serial pass"
  "$OUT/ginkgo" -nodes=1 -focus="\[Serial\].*$focus|$focus.*\[Serial\]" -skip='\[Disruptive\]|\[Flaky\]' "$OUT/e2e.test" -- \
    --provider=skeleton --kubeconfig="$KUBECONFIG" --kubectl-path="$OUT/kubectl" \
    --disable-log-dump --repo-root="$SRC" --report-dir="$results" --report-prefix=serial \
    --e2e-verify-service-account=false >"$results/serial.log" 2>&1 || true
  report "$results" | tee "$results/summary.txt"
}

case "${1:-}" in
  build) build ;;
  run) shift; run "$@" ;;
  report) report "$2" ;;
  *) die "usage: hack/conformance-1.20.sh build | run [FOCUS] | report DIR" ;;
esac
