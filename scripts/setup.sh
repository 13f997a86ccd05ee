#!/usr/bin/env bash
# Installs every Debian 12 package Monolith-C needs to build, test and run.
# Idempotent: packages already present are skipped, apt-get update runs only when needed.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git
  libxxhash-dev libjemalloc-dev libcriterion-dev
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libssl-dev openssl
  librdkafka-dev librocksdb-dev libopenblas-dev
  kcat gnuplot-nox clang-format redis-server libhiredis-dev zlib1g-dev
  clang
  protobuf-compiler protobuf-compiler-grpc python3-grpcio python3-protobuf
    prometheus
  python3-torch
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
