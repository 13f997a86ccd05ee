#!/usr/bin/env bash
# The main job. Today: builds Monolith-C and runs the embedding-table benchmark at full scale
# (10 million ids, dim 16, Adagrad), printing one JSON line per figure. Later issues turn this
# into the one-command local cluster (broker, PS shards, joiner, trainer, serving).
# Pass benchmark flags through, e.g. `scripts/run-local.sh --quick` or `--rows 2000000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release >/dev/null
exec build/release/bench/table_bench "$@"
