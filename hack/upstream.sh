#!/usr/bin/env bash
# Builds upstream's own programs from Go modules (the machine's Go and module proxy, as set up
# here): the clients minik8s is tested with and the suite it is measured by.
#
#   bash hack/upstream.sh TOOL...     TOOL: kubectl helm k9s kn e2e ginkgo agnhost nnp
#                                     sample-apiserver kube-apiserver kube-controller-manager
#                                     kube-scheduler etcd (or all)
#
# kubectl, e2e.test, ginkgo and the programs of the suite's images (agnhost, nnp,
# sample-apiserver) are Kubernetes v1.34's, through the wrapper module in
# conformance/upstream (its go.mod pins every staging module); Helm 3 and k9s are `go install`ed
# at the versions below from their own modules; Knative's `kn` through the module in
# conformance/kn (its go.sum pins every module; the checksum database has no record of the
# client-pkg pseudo-version kn v0.42.0 names, so that one is checked against go.sum alone).
# Upstream's control plane for the scale benchmark: kube-apiserver, kube-controller-manager and
# kube-scheduler of v1.34 through the same wrapper module, and etcd 3.6.4 (the version v1.34
# ships) through bench/upstream/etcd.
# Binaries land in BIN (default
# target/upstream/bin); a binary already there is kept (remove it to rebuild). The Go build and
# module caches are the machine's (~/.cache/go-build, ~/go/pkg/mod).
source "$(dirname "$0")/lib.sh"
BIN="$(realpath -m "${BIN:-$ROOT/target/upstream/bin}")"
MODULE="$ROOT/conformance/upstream"
KUBE_VERSION=v1.34.4
HELM_VERSION=v3.22.0
K9S_VERSION=v0.50.16
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || die "go is missing: the upstream tools build with the machine's Go"
mkdir -p "$BIN"
# Built without cgo, as upstream's release binaries are; -trimpath keeps build paths out.
export CGO_ENABLED=0
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
  -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"

build_one() {
  local tool="$1" out="$BIN/$1"
  [ "$tool" = e2e ] && out="$BIN/e2e.test"
  if [ -x "$out" ]; then return 0; fi
  log "building $tool from Go modules"
  local start=$SECONDS
  case "$tool" in
    kubectl) (cd "$MODULE" && go build -trimpath -ldflags "$kube_ldflags" -o "$out" k8s.io/kubernetes/cmd/kubectl) ;;
    e2e) (cd "$MODULE" && go test -c -trimpath -ldflags "$kube_ldflags" -o "$out" k8s.io/kubernetes/test/e2e) ;;
    ginkgo) (cd "$MODULE" && go build -trimpath -o "$out" github.com/onsi/ginkgo/v2/ginkgo) ;;
    agnhost) (cd "$MODULE" && go build -trimpath -ldflags "-s -w" -o "$out" k8s.io/kubernetes/test/images/agnhost) ;;
    nnp) (cd "$MODULE" && go build -trimpath -ldflags "-s -w" -o "$out" k8s.io/kubernetes/test/images/nonewprivs) ;;
    sample-apiserver) (cd "$MODULE" && go build -trimpath -ldflags "-s -w" -o "$out" k8s.io/sample-apiserver) ;;
    kube-apiserver|kube-controller-manager|kube-scheduler)
      (cd "$MODULE" && go build -trimpath -ldflags "$kube_ldflags" -o "$out" "k8s.io/kubernetes/cmd/$tool") ;;
    etcd) (cd "$ROOT/bench/upstream/etcd" && go build -trimpath -ldflags "-s -w" -o "$out" .) ;;
    helm) GOBIN="$BIN" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
    kn) (cd "$ROOT/conformance/kn" && GONOSUMDB=knative.dev/client-pkg GOFLAGS=-mod=mod go build -trimpath \
          -ldflags "-s -w -X knative.dev/client/pkg/kn/commands/version.Version=v0.42.0" -o "$out" knative.dev/client/cmd/kn) ;;
    k9s) GOBIN="$BIN" go install -trimpath -ldflags "-s -w -X github.com/derailed/k9s/cmd.version=$K9S_VERSION" "github.com/derailed/k9s@$K9S_VERSION" ;;
    *) die "unknown tool $tool (known: kubectl helm k9s kn e2e ginkgo agnhost nnp sample-apiserver kube-apiserver kube-controller-manager kube-scheduler etcd all)" ;;
  esac
  [ -x "$out" ] || die "$tool did not build"
  log "$tool built in $((SECONDS - start)) s"
}

[ $# -gt 0 ] || die "usage: hack/upstream.sh TOOL... (kubectl helm k9s kn e2e ginkgo agnhost nnp sample-apiserver kube-apiserver kube-controller-manager kube-scheduler etcd all)"
for tool in "$@"; do
  if [ "$tool" = all ]; then
    for t in kubectl helm k9s kn e2e ginkgo agnhost nnp sample-apiserver \
      kube-apiserver kube-controller-manager kube-scheduler etcd; do build_one "$t"; done
  else
    build_one "$tool"
  fi
done
