#!/usr/bin/env bash
# Many trainers, at least once (docs/checkpoint.md, "Many trainers"): the same cluster as
# many_trainers_e2e.sh with checkpoints off and trainer.idempotent off, so that what the
# exactly-once mode saves is measured: on monolith-kafka-dev (examples: 6 partitions), two
# monolith-ps shards and three monolith-trainer --online in one group, committing their
# Kafka offsets every second, with pipelined steps (trainer.pipelined), while `monolith gen
# --kafka --rate` produces N examples and
# kcat 3 garbage messages:
#  1. kill -9 trainer 1 mid-stream: its partitions move to the others, which start them at
#     its last committed offsets and train again what it applied after its last commit;
#  2. a fourth trainer joins mid-stream (a rebalance); the last quarter of the stream is
#     produced once it holds partitions, so that it trains a share on any machine;
#  3. once the group has committed every partition to its end (`monolith offsets`: every
#     message consumed and trained, since a trainer commits only what it applied), the
#     trainers stop (SIGTERM): each shard's examples_applied is at least N (nothing lost),
#     and what it has beyond N is the duplicates, counted and printed (a JSON line).
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SOURCE_DIR; kcat.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
many_init many-alo

declare -a tr_pids
start_two_shards
say "PS shards on ${port[0]} and ${port[1]}"
start_trainer() { # start_trainer K
  "$MT_TRAINER_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" --online \
    --set kafka.group=many-alo --set trainer.checkpoint_interval_s=0 \
    --set trainer.commit_interval_ms=1000 --set trainer.batch_size=200 --set trainer.pipelined=true \
    --set trainer.progress_interval_ms=0 \
    --report "$tmp/tr$1.json" > "$tmp/tr$1.out" 2> "$tmp/tr$1.err" &
  tr_pids[$1]=$!
  pids+=($!)
}
# the group committed every partition to its end: every message was consumed, and trained
# (a trainer commits an offset only after the step that holds it was applied)
committed_to_end() {
  local o; o=$("$MT_CLI_BIN" offsets --kafka "$bs" --group many-alo 2> /dev/null | tail -1)
  [ "$(jnum "$o" committed_partitions)" = 6 ] && [ "$(jnum "$o" lag)" = 0 ]
}
e2e_check() { # every trainer that should run still runs
  local k
  for k in "${live[@]}"; do
    kill -0 "${tr_pids[$k]}" 2> /dev/null || fail "trainer $k exited: $(tail -2 "$tmp/tr$k.err")"
  done
}

# 3/4 of the stream first; the last quarter once trainer 4 holds partitions, so that it has
# messages to train whatever the machine's load (on a slow machine the others could be done
# with a single stream before its first assignment arrives)
N2=$((N / 4))
many_produce $((N - N2))
say "3 trainers start"
for k in 1 2 3; do start_trainer "$k"; done
live=(1 2 3)

wait_applied $((N / 4))
say "== 1. kill -9 trainer 1 at $(applied 0) examples"
kill -9 "${tr_pids[1]}"
wait "${tr_pids[1]}" 2> /dev/null || true
live=(2 3)

wait_applied $((N / 2))
say "== 2. trainer 4 joins at $(applied 0) examples"
start_trainer 4
live=(2 3 4)
t4_holds() { # trainer 4's last assignment gave it partitions
  local k; k=$(sed -n 's/.*: \([0-9]*\) partitions assigned.*/\1/p' "$tmp/tr4.err" | tail -1)
  [ "${k:-0}" -gt 0 ]
}
wait_until "$E2E_GUARD_S" t4_holds || fail "trainer 4 got no partition"
wait "$gen_pid" || fail "the producer failed"
many_produce "$N2" 22

many_produced
say "== 3. the group commits every partition to its end, then every trainer stops"
wait_until "$E2E_GUARD_S" committed_to_end ||
  fail "the group did not commit the topic's end: $("$MT_CLI_BIN" offsets --kafka "$bs" --group many-alo 2>&1 | tail -1)"
for k in "${live[@]}"; do kill -TERM "${tr_pids[$k]}"; done
for k in "${live[@]}"; do wait "${tr_pids[$k]}" || fail "trainer $k exited with $?"; done
live=()
a0=$(applied 0) a1=$(applied 1)
[ "${a0:-0}" -ge "$N" ] && [ "${a1:-0}" -ge "$N" ] ||
  fail "shards reflect ${a0:-?} / ${a1:-?} examples, fewer than the $N produced (lost)"
d0=$((a0 - N)) d1=$((a1 - N))
trained=0
for k in 2 3 4; do
  e=$(json "$tmp/tr$k.json" examples)
  say "trainer $k: ${e:-0} examples; $(grep -c "partitions assigned" "$tmp/tr$k.err") assignments"
  [ "${e:-0}" -gt 0 ] || fail "trainer $k trained nothing"
  trained=$((trained + e))
done
say "shards: $a0 / $a1 examples applied for $N produced: $d0 / $d1 applied twice" \
    "(trainer 1's work after its last commit; what members trained while a rebalance refused their commits)"
printf '{"test":"many_trainers_at_least_once","examples":%d,"duplicates":[%d,%d],"duplicate_share":%.4f}\n' \
  "$N" "$d0" "$d1" "$(awk -v d="$((d0 + d1))" -v n="$N" 'BEGIN { print d / (2 * n) }')"
if cat "$tmp"/*.err | grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"; then
  fail "sanitizer reports"
fi
say "many trainers, at least once: all good"
