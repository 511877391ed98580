#!/usr/bin/env bash
# What `make test-arm` needs beside scripts/deps.sh's packages: the AArch64
# cross compiler, qemu-user, and the arm64 builds of the libraries lamina
# links, from Debian's own arm64 archive (multiarch: the same versions as the
# amd64 ones, installed beside them under /usr/lib/aarch64-linux-gnu, where
# the cross linker and, under qemu, the arm64 dynamic loader look).
set -euo pipefail
pkgs=(gcc-aarch64-linux-gnu qemu-user libc6:arm64 libpcre2-dev:arm64 libmicrohttpd-dev:arm64 libcjson-dev:arm64
      libcurl4-openssl-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
