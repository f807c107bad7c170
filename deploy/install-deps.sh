#!/usr/bin/env bash
# Installs the system packages 3FS-KV needs to build, test and benchmark, if
# they are missing. Safe to run again. Debian/Ubuntu (apt) only.
#   clang, libclang-dev  bindgen for the RocksDB / FoundationDB / ibverbs bindings
#   librocksdb-dev       RocksDB 7.8 from Debian, linked instead of building it (~12 min saved)
#   fuse3, libacl1-dev   FUSE mount and POSIX ACLs
#   fio, iperf3          baselines measured next to our benchmarks
#   pkg-config           library discovery for -sys crates
#   etcd-server          etcd 3.4: the distributed KV engine's tests and the network-namespace cluster
#   iproute2             network namespaces, veth links and partitions (deploy/netns-cluster.sh)
#   cmake, libnl-3-dev, libnl-route-3-dev, libibverbs-dev
#                        `cargo check -p fskv-rpc --features rdma`: ibverbs-sys configures and
#                        builds its vendored rdma-core (no RDMA device is needed to compile)
set -euo pipefail

packages=(clang libclang-dev librocksdb-dev fuse3 libacl1-dev fio iperf3 pkg-config etcd-server iproute2 cmake libnl-3-dev libnl-route-3-dev libibverbs-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "install-deps: cargo (Rust) is required; install it with rustup" >&2; exit 1; }
if [ ! -e /usr/lib/x86_64-linux-gnu/librocksdb.so ]; then
    echo "install-deps: /usr/lib/x86_64-linux-gnu/librocksdb.so not found after installing librocksdb-dev" >&2
    exit 1
fi
echo "install-deps: all system packages present"
