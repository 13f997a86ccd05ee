#!/usr/bin/env bash
# The local cluster on one machine, on a stream it generates itself:
#   monolith replay --dataset gen (impressions to `features`, clicks to `actions`, from the
#   synthetic click stream with a hidden ground-truth model, paced) -> monolith-kafka-dev
#   (the embedded broker) -> monolith-joiner (labelled examples to `examples`) ->
#   monolith-trainer --online -> N monolith-ps shards; for a fixed duration, then a report.
#
#   deploy/local-cluster.sh [--quick] [--shards N] [--seconds S] [--rate EX_PER_S]
#
# Binaries from build/release (scripts/run-local.sh builds them first). Everything runs on
# 127.0.0.1 with OS-chosen ports; logs and the reports land in build/run/. Serving closes
# the loop with issue #6.
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

echo "== joiner: monolith-joiner (window 10 s of event time)"
"$bin/joiner/monolith-joiner" --config "$conf" --set "kafka.bootstrap=$bootstrap" \
  --set joiner.window_s=10 --set "joiner.state_dir=$PWD/$run/joiner" \
  --set joiner.progress_interval_ms=0 --duration-s $((seconds + 8)) --drain \
  --report "$run/joiner.json" > "$run/joiner.out" 2> "$run/joiner.log" &
joiner=$!
pids+=($joiner)

echo "== trainer: monolith-trainer --online (progress every 5 s)"
"$bin/trainer/monolith-trainer" --config "$conf" --online --duration-s $((seconds + 15)) \
  --set "kafka.bootstrap=$bootstrap" --set "cluster.ps=$addrs" \
  --set trainer.progress_interval_ms=5000 --set trainer.metrics_listen=127.0.0.1:0 \
  --report "$run/report.json" 2> >(tee "$run/trainer.log" | grep --line-buffered -E "online|error|ERROR" >&2) &
trainer=$!
pids+=($trainer)

echo "== stream: monolith replay --dataset gen, $rate impressions/s for ${seconds}s"
"$bin/cli/monolith" replay --dataset gen --kafka "$bootstrap" --limit $((rate * seconds)) \
  --seed 1 --users 200000 --items 50000 --events-per-s 1000 \
  --speed "$(awk -v r="$rate" 'BEGIN { print r / 1000 }')" --progress-s 0 \
  > "$run/replay.json" 2> "$run/replay.log" || { cat "$run/replay.log"; exit 1; }
wait "$joiner" || { echo "joiner failed: see $run/joiner.log"; exit 1; }
wait "$trainer" || { echo "trainer failed: see $run/trainer.log"; exit 1; }

echo "== report"
printf 'replay:  '; cat "$run/replay.json"
printf 'joiner:  '; cat "$run/joiner.json"
printf 'trainer: '; cat "$run/report.json"
for i in $(seq 0 $((shards - 1))); do
  printf 'shard %d: ' "$i"
  "$bin/cli/monolith" stats --addr "127.0.0.1:$(cat "$run/ps$i.port")" | head -c 300; echo
done
