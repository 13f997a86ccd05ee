#!/usr/bin/env bash
# bench/many_trainers_bench.sh - many trainers against two shards (docs/checkpoint.md, "Many
# trainers"): for K = 1, 2, 3 monolith-trainer --online processes in one group with
# trainer.idempotent (covered steps), against two fresh monolith-ps shards, on a backlog of M
# examples produced once the group has settled (monolith-kafka-dev, examples: 6 partitions;
# the model of deploy/trainer.example.conf): the wall time from the first example produced
# until both shards reflect the M examples, the aggregate examples/s, and the CPU seconds
# per example summed over every process (trainers, shards, broker). On this 2-core machine
# the processes share the cores, so the aggregate rate cannot scale with K; the CPU time
# per example is what decides scaling on hosts where each process has its own cores.
#
#   bash bench/many_trainers_bench.sh [--quick] [--examples M (120000)] [--pipelined]
#                                     [--build DIR]
# --pipelined: the trainers pipeline their covered steps (trainer.pipelined: one apply in
# flight while the next step computes).
#
# One JSON line per K on stdout ({"bench": "many_trainers", ...}) and a conditions line
# (the machine's CPU taken by other processes during the run, as the C benches print).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build/release"
M=120000
pipelined=false
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) M=12000 ;;
    --examples) M=$2; shift ;;
    --pipelined) pipelined=true ;;
    --build) build=$2; shift ;;
    *) echo "many_trainers_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export MT_TRAINER_BIN="$build/trainer/monolith-trainer" MT_PS_BIN="$build/ps/monolith-ps"
export MT_CLI_BIN="$build/cli/monolith" MT_KAFKA_BIN="$build/kafka/monolith-kafka-dev"
export MT_SOURCE_DIR="$here"
for b in "$MT_TRAINER_BIN" "$MT_PS_BIN" "$MT_CLI_BIN" "$MT_KAFKA_BIN"; do
  [ -x "$b" ] || { echo "many_trainers_bench: $b is missing (bash scripts/build.sh release)" >&2; exit 2; }
done
. "$here/tests/e2e/lib.sh"
hz=$(getconf CLK_TCK)
cpu_s() { # the CPU seconds (user + system) of the processes given, 0 for those gone
  local t=0 p f
  for p in "$@"; do
    f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2> /dev/null) || continue
    t=$((t + ${f% *} + ${f#* }))
  done
  awk -v t="$t" -v hz="$hz" 'BEGIN { printf "%.3f", t / hz }'
}
machine_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }

run_k() { # run_k K: one measured run with K trainers, everything fresh
  local k=$1 i
  e2e_init "many-bench-$k"
  start_kafka examples:6,features:1
  local conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
  local model=(--set kafka.session_timeout_ms=6000 --set "kafka.bootstrap=$bs")
  local tr=()
  start_two_shards
  local kafka_pid=${pids[0]}
  for i in $(seq "$k"); do
    "$MT_TRAINER_BIN" --config "$conf" "${model[@]}" \
      --set "cluster.ps=$cluster" --online \
      --set kafka.group=bench --set trainer.idempotent=true --set trainer.batch_size=256 \
      --set "trainer.pipelined=$pipelined" --set trainer.progress_interval_ms=0 > "$tmp/tr$i.out" 2> "$tmp/tr$i.err" &
    pids+=($!) tr+=($!)
  done
  # the group settled: every trainer holds partitions, the 6 of them in all
  settled() {
    local j n sum=0
    for j in $(seq "$k"); do
      n=$(sed -n 's/.*trainer: partitions (\([0-9]*\)).*/\1/p' "$tmp/tr$j.err" | tail -1)
      [ "${n:-0}" -gt 0 ] || return 1
      sum=$((sum + n))
    done
    [ "$sum" -eq 6 ]
  }
  wait_until 600 settled || fail "the group of $k trainers did not settle"
  local s0 t0c b0 t_start
  s0=$(cpu_s "${ps_pids[@]}" "$kafka_pid")
  t0c=$(cpu_s "${tr[@]}")
  b0=$(machine_busy)
  t_start=$(date +%s.%N)
  "$MT_CLI_BIN" gen --examples "$M" --seed 41 --users 20000 --items 5000 --kafka "$bs" \
    --topic examples > /dev/null 2> "$tmp/gen.err" &
  local gen_pid=$!
  pids+=($!)
  done_both() { [ "$(applied 0)" = "$M" ] && [ "$(applied 1)" = "$M" ]; }
  wait_until 1800 done_both || fail "shards at $(applied 0) / $(applied 1) of $M"
  local t_end s1 t1c b1
  t_end=$(date +%s.%N)
  s1=$(cpu_s "${ps_pids[@]}" "$kafka_pid")
  t1c=$(cpu_s "${tr[@]}")
  b1=$(machine_busy)
  wait "$gen_pid" || fail "producer: $(cat "$tmp/gen.err")"
  awk -v k="$k" -v m="$M" -v pl="$pipelined" -v w0="$t_start" -v w1="$t_end" -v s0="$s0" -v s1="$s1" \
      -v t0="$t0c" -v t1="$t1c" -v b0="$b0" -v b1="$b1" -v ncpu="$(nproc)" 'BEGIN {
    split(b0, x, " "); split(b1, y, " ");
    wall = w1 - w0; tr = t1 - t0; sh = s1 - s0; own = tr + sh;
    busy = (y[1] - x[1]) / 100; total = (y[2] - x[2]) / 100;
    others = busy - own; if (others < 0) others = 0;
    share = total > 0 ? others / total : 0;
    printf "{\"bench\":\"many_trainers\",\"metric\":\"examples_per_s\",\"value\":%.0f,\"unit\":\"examples/s\",\"trainers\":%d,\"pipelined\":%s,\"shards\":2,\"examples\":%d,\"wall_s\":%.2f,\"per_trainer\":%.0f,\"cpu_s_trainers\":%.2f,\"cpu_s_shards_broker\":%.2f,\"cpu_us_per_example\":%.1f,\"cores\":%d}\n", m / wall, k, pl, m, wall, m / wall / k, tr, sh, own * 1e6 / m, ncpu;
    printf "{\"bench\":\"many_trainers\",\"metric\":\"conditions\",\"value\":%.2f,\"unit\":\"s\",\"trainers\":%d,\"wall_s\":%.2f,\"cpu_s\":%.2f,\"others_busy_share\":%.3f}\n", wall, k, wall, own, share;
  }'
  e2e_cleanup
  trap - EXIT
}
for k in 1 2 3; do run_k "$k"; done
