#!/usr/bin/env bash
# Installs the OpenCL runtime syncmem's device tests and demo use: the ICD loader and PoCL, the
# CPU OpenCL driver. With --with-browser, also Chromium, which the memory page's test renders
# the page in (headless). With --with-mpi, also Open MPI (`mpirun`, the library and its headers)
# and libclang, which the `mpi` feature (distributed training) builds and runs with.
# Idempotent and non-interactive; Debian/Ubuntu (apt) only.
set -euo pipefail

packages=(ocl-icd-libopencl1 pocl-opencl-icd)
for arg in "$@"; do
    case "$arg" in
        --with-browser) packages+=(chromium) ;;
        --with-mpi) packages+=(openmpi-bin libopenmpi-dev libclang-dev) ;;
        *) echo "setup: unknown option $arg (known: --with-browser, --with-mpi)" >&2; exit 2 ;;
    esac
done

installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = "installed" ]
}

missing=()
for p in "${packages[@]}"; do
    if installed "$p"; then
        echo "setup: $p is already installed"
    else
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: nothing to do"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: apt-get not found; install an OpenCL ICD loader and driver (PoCL) by hand: ${missing[*]}" >&2
    exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "setup: not root and sudo not found; run as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
echo "setup: installed ${missing[*]}"
