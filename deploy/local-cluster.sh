#!/usr/bin/env bash
# The local cluster on one machine, on a stream it generates itself:
#   monolith-kafka-dev (the embedded broker) -> N monolith-ps shards -> monolith-trainer
#   --online, fed by `monolith gen --kafka` (the synthetic click stream with a hidden
#   ground-truth model, paced in real time), for a fixed duration; then a report.
#
#   deploy/local-cluster.sh [--quick] [--shards N] [--seconds S] [--rate EX_PER_S]
#
# Binaries from build/release (scripts/run-local.sh builds them first). Everything runs on
# 127.0.0.1 with OS-chosen ports; logs and the report land in build/run/. Serving and the
# joiner join this loop with issues #5 and #6.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${MT_BIN:-build/release}
shards=2 seconds=60 rate=8000
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) seconds=15 rate=4000 ;;
    --shards) shards=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --rate) rate=$2; shift ;;
    *) echo "usage: deploy/local-cluster.sh [--quick] [--shards N] [--seconds S] [--rate R]" >&2
       exit 2 ;;
  esac
  shift
done
run=build/run
rm -rf "$run"
mkdir -p "$run"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
wait_file() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

conf=deploy/trainer.example.conf
echo "== broker: monolith-kafka-dev (examples: 8 partitions)"
"$bin/kafka/monolith-kafka-dev" --topics examples:8,features:8,actions:8 \
  --bootstrap-file "$run/bootstrap" > /dev/null 2> "$run/kafka.log" &
pids+=($!)
wait_file "$run/bootstrap" || { cat "$run/kafka.log"; exit 1; }
bootstrap=$(cat "$run/bootstrap")
echo "   $bootstrap"

echo "== $shards PS shards: monolith-ps"
addrs=""
for i in $(seq 0 $((shards - 1))); do
  "$bin/ps/monolith-ps" --config "$conf" --shard "$i" --num-shards "$shards" \
    --listen 127.0.0.1:0 --port-file "$run/ps$i.port" --set ps.metrics_listen=127.0.0.1:0 \
    --set "ps.snapshot_dir=$PWD/$run/snap$i" 2> "$run/ps$i.log" &
  pids+=($!)
  wait_file "$run/ps$i.port" || { cat "$run/ps$i.log"; exit 1; }
  addrs="$addrs${addrs:+,}127.0.0.1:$(cat "$run/ps$i.port")"
done
echo "   $addrs"

echo "== stream: monolith gen --kafka, $rate examples/s for ${seconds}s"
"$bin/cli/monolith" gen --examples $((rate * seconds)) --seed 1 --users 200000 --items 50000 \
  --kafka "$bootstrap" --topic examples --rate "$rate" 2> "$run/gen.log" &
gen=$!
pids+=($gen)

echo "== trainer: monolith-trainer --online (progress every 5 s)"
"$bin/trainer/monolith-trainer" --config "$conf" --online --duration-s $((seconds + 5)) \
  --set "kafka.bootstrap=$bootstrap" --set "cluster.ps=$addrs" \
  --set trainer.progress_interval_ms=5000 --set trainer.metrics_listen=127.0.0.1:0 \
  --report "$run/report.json" 2> >(tee "$run/trainer.log" | grep --line-buffered -E "online|error|ERROR" >&2)
wait "$gen" || true

echo "== report (also $run/report.json)"
cat "$run/report.json"
for i in $(seq 0 $((shards - 1))); do
  printf 'shard %d: ' "$i"
  "$bin/cli/monolith" stats --addr "127.0.0.1:$(cat "$run/ps$i.port")" | head -c 300; echo
done
