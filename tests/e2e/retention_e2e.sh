#!/usr/bin/env bash
# Kafka's retention passed the shards' marks (docs/checkpoint.md, failure table): on
# monolith-kafka-dev (examples: 1 partition; a mock partition keeps about 5 MiB or 100,000
# messages and drops older ones), two monolith-ps shards and one monolith-trainer --online
# with trainer.idempotent:
#  1. the trainer trains N examples and stops (SIGTERM): both shards' marks are at N;
#  2. BURST more examples are produced with no trainer running, so that the partition's log
#     start passes the marks: the examples in between are gone from Kafka;
#  3. a trainer starts: it must stop with an error that names the partition, the mark and
#     the log start, exit non-zero, and apply nothing (both shards still at N): a loss
#     said, never silent.
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SOURCE_DIR.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
: "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_SOURCE_DIR:?}"
N=${MT_RETENTION_EXAMPLES:-2000}
BURST=${MT_RETENTION_BURST:-150000}
e2e_init retention
start_kafka examples:1,features:1
conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
model=(--set trainer.hidden=32,16 --set trainer.dim=8 --set kafka.session_timeout_ms=6000
       --set "kafka.bootstrap=$bs")
start_two_shards
start_trainer() { # start_trainer K
  "$MT_TRAINER_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" --online \
    --set kafka.group=retention --set trainer.idempotent=true --set trainer.batch_size=200 \
    --set trainer.progress_interval_ms=0 \
    > "$tmp/tr$1.out" 2> "$tmp/tr$1.err" &
  tr_pid=$!
  pids+=($!)
}

say "== 1. $N examples trained by one trainer, which then stops"
"$MT_CLI_BIN" gen --examples "$N" --seed 31 --kafka "$bs" --topic examples \
  > /dev/null 2> "$tmp/gen1.err" || fail "producer: $(cat "$tmp/gen1.err")"
start_trainer 1
e2e_check() { kill -0 "$tr_pid" 2> /dev/null || fail "trainer 1 exited: $(tail -2 "$tmp/tr1.err")"; }
wait_applied "$N"
both_at_n() { [ "$(applied 0)" = "$N" ] && [ "$(applied 1)" = "$N" ]; }
wait_until "$E2E_GUARD_S" both_at_n || fail "shards at $(applied 0) / $(applied 1), not $N"
kill -TERM "$tr_pid"
wait "$tr_pid" || fail "trainer 1 exited with $? at SIGTERM"
unset -f e2e_check

say "== 2. $BURST more examples with no trainer: the log start passes the marks"
"$MT_CLI_BIN" gen --examples "$BURST" --seed 32 --kafka "$bs" --topic examples \
  > /dev/null 2> "$tmp/gen2.err" || fail "producer: $(cat "$tmp/gen2.err")"

say "== 3. a trainer starts: it stops on the gap, says where, and applies nothing"
start_trainer 2
rc=0
wait_until "$E2E_GUARD_S" sh -c "! kill -0 $tr_pid 2> /dev/null" ||
  fail "trainer 2 did not stop on the gap: $(tail -3 "$tmp/tr2.err")"
wait "$tr_pid" || rc=$?
line=$(grep "stopping:" "$tmp/tr2.err" | head -1)
say "trainer 2 exited with $rc: ${line#*stopping: }"
[ "$rc" -ne 0 ] || fail "trainer 2 exited with 0 after a retention gap"
grep -q "examples \[0\]" <<< "$line" || fail "the error does not name the partition: $line"
grep -qE "\b$N\b" <<< "$line" || fail "the error does not name the mark $N: $line"
a0=$(applied 0) a1=$(applied 1)
[ "$a0" = "$N" ] && [ "$a1" = "$N" ] || fail "shards at $a0 / $a1 after the gap, not $N"
say "shards still at $a0 / $a1 examples"
if cat "$tmp"/*.err | grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"; then
  fail "sanitizer reports"
fi
say "retention past the marks: said, exit 1, nothing applied"
