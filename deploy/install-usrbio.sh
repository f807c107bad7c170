#!/usr/bin/env bash
# Installs USRBIO for programs: the C library libhf3fs_api_shared.so, its
# header hf3fs_usrbio.h (also as hf3fs/hf3fs_usrbio.h), a pkg-config file
# hf3fs_usrbio.pc, and the Python module hf3fs_fuse.io.
#
#   deploy/install-usrbio.sh [--prefix DIR] [--python PY | --python-target DIR | --no-python] [--debug]
#
# --prefix DIR          where lib/, include/, lib/pkgconfig/ go (default /usr/local)
# --python PY           install hf3fs_fuse into PY's environment with pip (default python3)
# --python-target DIR   copy the hf3fs_fuse package into DIR instead (add DIR to PYTHONPATH)
# --no-python           skip the Python module
# --debug               install the debug build (default: release)
#
# Then: cc prog.c $(pkg-config --cflags --libs hf3fs_usrbio)   (PKG_CONFIG_PATH=DIR/lib/pkgconfig
# for a prefix pkg-config does not search), and `import hf3fs_fuse.io`.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=/usr/local
python=python3
python_target=""
profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --python-target) python_target=$2; shift 2 ;;
        --no-python) python=""; shift ;;
        --debug) profile=debug; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "install-usrbio: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$profile" = release ]; then
    cargo build --quiet --release -p fskv-usrbio-capi
else
    cargo build --quiet -p fskv-usrbio-capi
fi
lib=${CARGO_TARGET_DIR:-target}/$profile/libhf3fs_api_shared.so
[ -f "$lib" ] || { echo "install-usrbio: $lib was not built" >&2; exit 1; }
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/hf3fs"
prefix=$(cd "$prefix" && pwd)
install -m 0755 "$lib" "$prefix/lib/libhf3fs_api_shared.so"
install -m 0644 client/usrbio/capi/include/hf3fs_usrbio.h "$prefix/include/hf3fs_usrbio.h"
install -m 0644 client/usrbio/capi/include/hf3fs_usrbio.h "$prefix/include/hf3fs/hf3fs_usrbio.h"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cat >"$prefix/lib/pkgconfig/hf3fs_usrbio.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: hf3fs_usrbio
Description: USRBIO (3FS's shared-memory ring I/O) for 3FS-KV mounts
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lhf3fs_api_shared
Cflags: -I\${includedir}
PC
echo "install-usrbio: C library, header and pkg-config file in $prefix"

if [ -n "$python_target$python" ]; then
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp -r client/usrbio/python/. "$stage/"
    # The module finds the library here unless HF3FS_USRBIO_LIB says otherwise.
    printf 'LIBRARY = %s\n' "'$prefix/lib/libhf3fs_api_shared.so'" >"$stage/hf3fs_fuse/_installed.py"
    if [ -n "$python_target" ]; then
        mkdir -p "$python_target"
        rm -rf "$python_target/hf3fs_fuse"
        cp -r "$stage/hf3fs_fuse" "$python_target/"
        echo "install-usrbio: Python module hf3fs_fuse in $python_target"
    elif "$python" -c 'import setuptools, wheel' 2>/dev/null; then
        "$python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall "$stage"
        echo "install-usrbio: Python module hf3fs_fuse installed for $("$python" -c 'import sys; print(sys.executable)')"
    else
        site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        rm -rf "$site/hf3fs_fuse"
        cp -r "$stage/hf3fs_fuse" "$site/"
        echo "install-usrbio: Python module hf3fs_fuse copied to $site (no setuptools/wheel for pip)"
    fi
fi
