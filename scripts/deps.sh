#!/usr/bin/env bash
# Installs the Debian packages lamina needs to build and test, when missing.
# Safe to run repeatedly: it only calls apt-get when something is absent.
# With --arm, what `make test-arm` needs instead: the AArch64 cross
# compiler, qemu-user, and the arm64 builds of the libraries lamina links,
# from Debian's own arm64 archive (multiarch: the same versions as the amd64
# ones, installed beside them under /usr/lib/aarch64-linux-gnu, where the
# cross linker and, under qemu, the arm64 dynamic loader look).
set -euo pipefail
arm=0
[ "${1:-}" = "--arm" ] && arm=1
if [ $arm -eq 1 ]; then
    pkgs=(gcc-aarch64-linux-gnu qemu-user libc6:arm64 libpcre2-dev:arm64 libmicrohttpd-dev:arm64 libcjson-dev:arm64
          libcurl4-openssl-dev:arm64)
else
    pkgs=(gcc make clang clang-format libclang-rt-14-dev libpcre2-dev libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev pkg-config python3 python3-venv python3-pip chromium chromium-driver libopenmpi-dev openmpi-bin)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if [ $arm -eq 1 ]; then
        dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
