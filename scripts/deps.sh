#!/usr/bin/env bash
# Installs the Debian packages lamina needs to build and test, when missing.
# Safe to run repeatedly: it only calls apt-get when something is absent.
set -euo pipefail
pkgs=(gcc make clang libclang-rt-14-dev libpcre2-dev libmicrohttpd-dev libcjson-dev libcurl4-openssl-dev pkg-config python3 python3-venv python3-pip chromium chromium-driver libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
