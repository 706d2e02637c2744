#!/usr/bin/env bash
# Loads an image archive (docker-archive or OCI tar, e.g. from `docker save` or
# `skopeo copy … docker-archive:FILE:NAME`) into the running cluster: each tag of a docker
# archive is pushed to the node's local registry (REGISTRY, default 127.0.0.1:5000), where the
# kubelet pulls it like from any registry (`docker.io/...` and `registry.k8s.io/...` names
# resolve there); the archive is also imported into containerd, for `imagePullPolicy: Never`.
#   hack/load-image.sh FILE.tar          (DATA_DIR defaults to /var/lib/minik8s)
source "$(dirname "$0")/lib.sh"
need_root
[ $# -eq 1 ] || die "usage: hack/load-image.sh FILE.tar"
[ -f "$1" ] || die "no such file: $1"
DATA_DIR="${DATA_DIR:-/var/lib/minik8s}"
REGISTRY="${REGISTRY:-127.0.0.1:5000}"
SOCK="$DATA_DIR/node/containerd/containerd.sock"
[ -S "$SOCK" ] || die "no containerd socket at $SOCK: is the cluster up (hack/up.sh)?"
ctr -a "$SOCK" -n k8s.io images import "$1"
if curl -sf "http://$REGISTRY/v2/" >/dev/null 2>&1; then
  tags="$(tar -xOf "$1" manifest.json 2>/dev/null | grep -o '"RepoTags":\[[^]]*\]' | sed 's/^"RepoTags":\[//; s/\]$//' | tr ',' '\n' | tr -d '"' || true)"
  for tag in $tags; do
    name="${tag%:*}"; version="${tag##*:}"
    case "$name" in
      docker.io/*/*|registry.k8s.io/*) path="${name#*/}" ;;
      docker.io/*) path="library/${name#docker.io/}" ;;
      */*) case "${name%%/*}" in *.*|*:*|localhost) continue ;; *) path="$name" ;; esac ;;
      *) path="library/$name" ;;
    esac
    skopeo copy -q --dest-tls-verify=false "docker-archive:$1:$tag" "docker://$REGISTRY/$path:$version"
    log "pushed $tag to the local registry ($REGISTRY/$path:$version)"
  done
fi
