#!/usr/bin/env bash
# Installs what minik8s needs from Debian's packages. Idempotent: installs only what is missing.
#   hack/install-deps.sh          control plane and tests (etcd, protoc)
#   hack/install-deps.sh --node   also the node runtime (containerd, runc, CNI, iptables, image tools)
source "$(dirname "$0")/lib.sh"
need_root

packages=(etcd-server etcd-client protobuf-compiler libprotobuf-dev ca-certificates)
if [ "${1:-}" = "--node" ]; then
  packages+=(containerd runc iptables busybox-static containernetworking-plugins umoci skopeo gcc libc6-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's etcd-server starts a system etcd on :2379 from its postinst; policy-rc.d keeps it off,
  # since minik8s starts its own private etcd when it needs one.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || die "cargo is missing: minik8s builds with the machine's Rust toolchain (rustup)"
log "dependencies present: ${packages[*]}"
