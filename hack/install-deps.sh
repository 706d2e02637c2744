#!/usr/bin/env bash
# Installs what minik8s needs from Debian's packages. Idempotent: installs only what is missing.
#   hack/install-deps.sh          control plane and tests (etcd, protoc)
#   hack/install-deps.sh --node   also the node runtime (containerd, runc, CNI, iptables, image tools,
#                                 and docker-registry and Docker's dockerd unpacked in /opt/minik8s)
#   hack/install-deps.sh --slurm  also Slurm, munge and OpenSSH (for hack/slurm.sh); options combine
source "$(dirname "$0")/lib.sh"
need_root

# g++: the fuzz crate builds libFuzzer (libfuzzer-sys) with the workspace. libfaketime: the
# linearizability test steps the clock of a running `minik8s up`.
packages=(etcd-server etcd-client protobuf-compiler libprotobuf-dev ca-certificates g++ libfaketime)
node=0
for arg in "$@"; do
  case "$arg" in
    --node)
      node=1
      packages+=(containerd runc iptables busybox-static containernetworking-plugins umoci skopeo gcc libc6-dev make bzip2 curl python3-venv dnsperf) ;;
    # A private Slurm cluster and its SSH login node (hack/slurm.sh starts them; their
    # services stay off, policy-rc.d below).
    --slurm) packages+=(slurmctld slurmd slurm-client munge openssh-server openssh-client gcc libc6-dev) ;;
    *) die "unknown option $arg (known: --node, --slurm)" ;;
  esac
done

# Docker's own packages (containerd.io, which carries runc too) conflict with Debian's
# containerd and runc: where they are installed, minik8s uses their containerd and runc as
# they are (each node starts its own containerd with a private config, socket and state,
# beside Docker's) and installs neither of Debian's. Docker itself is never touched.
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
if [ "$node" = 1 ] && installed containerd.io; then
  log "Docker's containerd.io is installed: using its containerd and runc (Debian's conflict with it)"
  kept=()
  for p in "${packages[@]}"; do case "$p" in containerd|runc) ;; *) kept+=("$p") ;; esac; done
  packages=("${kept[@]}")
  for b in containerd containerd-shim-runc-v2 runc; do
    command -v "$b" >/dev/null || die "containerd.io is installed but $b is not on the PATH"
  done
fi
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
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
# Debian's docker-registry, unpacked rather than installed: its package starts a system registry
# on :5000 (with htpasswd auth) from its postinst; minik8s runs its own on loopback.
REGISTRY_DIR=/opt/minik8s/docker-registry
if [ "$node" = 1 ] && [ ! -x "$REGISTRY_DIR/usr/bin/docker-registry" ]; then
  log "unpacking Debian's docker-registry into $REGISTRY_DIR"
  tmp="$(mktemp -d)"
  chmod 755 "$tmp"
  (cd "$tmp" && { apt-get download -qq docker-registry 2>/dev/null \
                  || { apt-get update -qq && apt-get download -qq docker-registry; }; })
  mkdir -p "$REGISTRY_DIR"
  dpkg -x "$tmp"/docker-registry_*.deb "$REGISTRY_DIR"
  rm -rf "$tmp"
  [ -x "$REGISTRY_DIR/usr/bin/docker-registry" ] || die "docker-registry did not unpack"
fi
# Debian's Docker Engine, unpacked rather than installed, for edge machines on Docker (the
# tests start a private dockerd per machine): its package would start a system dockerd and
# conflicts with Docker's own packages; a Docker the machine has is left as it is.
DOCKER_DIR=/opt/minik8s/docker
if [ "$node" = 1 ] && [ ! -x "$DOCKER_DIR/usr/sbin/dockerd" ]; then
  log "unpacking Debian's docker.io into $DOCKER_DIR"
  tmp="$(mktemp -d)"
  chmod 755 "$tmp"
  (cd "$tmp" && { apt-get download -qq docker.io 2>/dev/null \
                  || { apt-get update -qq && apt-get download -qq docker.io; }; })
  mkdir -p "$DOCKER_DIR"
  dpkg -x "$tmp"/docker.io_*.deb "$DOCKER_DIR"
  rm -rf "$tmp"
  [ -x "$DOCKER_DIR/usr/sbin/dockerd" ] || die "docker.io did not unpack"
fi
command -v cargo >/dev/null || die "cargo is missing: minik8s builds with the machine's Rust toolchain (rustup)"
log "dependencies present: ${packages[*]}"
