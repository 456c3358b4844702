#!/usr/bin/env bash
# Installs the Debian 12 packages skvq builds with (only those missing).
set -euo pipefail
pkgs=(cmake g++ make libgtest-dev libbenchmark-dev libhwy-dev nlohmann-json3-dev libcli11-dev libopenblas-dev clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
