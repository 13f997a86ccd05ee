#!/usr/bin/env bash
# The main job: installs what is missing, builds Monolith-C, and runs the local cluster on a
# stream it generates itself (deploy/local-cluster.sh: the embedded Kafka broker, PS shards
# and an online trainer fed by the synthetic click stream), ending with a report.
#
#   scripts/run-local.sh [--quick] [--shards N] [--seconds S] [--rate EX_PER_S]
#   scripts/run-local.sh --table-bench [table_bench flags]   the 10M-id table benchmark
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release >/dev/null
if [ "${1:-}" = "--table-bench" ]; then
  shift
  exec build/release/bench/table_bench "$@"
fi
exec bash deploy/local-cluster.sh "$@"
