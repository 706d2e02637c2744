#!/usr/bin/env bash
# Loads an image archive (docker-archive or OCI tar, e.g. from `docker save` or
# `skopeo copy … docker-archive:FILE:NAME`) into the running cluster's containerd, where pods
# can use it with `imagePullPolicy: IfNotPresent` or `Never`.
#   hack/load-image.sh FILE.tar          (DATA_DIR defaults to /var/lib/minik8s)
source "$(dirname "$0")/lib.sh"
need_root
[ $# -eq 1 ] || die "usage: hack/load-image.sh FILE.tar"
[ -f "$1" ] || die "no such file: $1"
DATA_DIR="${DATA_DIR:-/var/lib/minik8s}"
SOCK="$DATA_DIR/node/containerd/containerd.sock"
[ -S "$SOCK" ] || die "no containerd socket at $SOCK: is the cluster up (hack/up.sh)?"
ctr -a "$SOCK" -n k8s.io images import "$1"
