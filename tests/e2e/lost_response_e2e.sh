#!/usr/bin/env bash
# Exactly-once under a lost response (docs/checkpoint.md, "Steps are never retried"), counted:
# on monolith-kafka-dev, two monolith-ps shards with snapshot stores and
# monolith-trainer --online with trainer.checkpoint_interval_s = 1, which reaches PS shard 1
# through mt_faultproxy (tests/e2e/faultproxy.c), while `monolith gen --kafka --rate`
# produces the stream: chunks of CHUNK examples, one after another until the windows are
# done (so examples are still coming at every window, however long the windows take on a
# loaded machine); N is what the chunks delivered. WINDOWS times, SPACING examples apart,
# the proxy is triggered (SIGUSR1) and waits for the next ApplyGradients that carries
# examples (gradients, field 2, and examples, field 5: --arm-fields 2:2,5:0); it forwards it
# to the shard, which applies it and answers; the proxy drops that answer (--until-answer:
# until its gRPC trailers went by, however late the shard answers; DROP_MS is only a hang
# guard), then resets the connection. Then:
#  1. each window forwarded the request and dropped the complete answer to it (its gRPC
#     trailers): the shard applied a step whose answer the trainer never got;
#  2. the trainer did not retry the call (its PS client makes no transport retries in this
#     mode) but recovered: every shard back to the last complete checkpoint, the consumer
#     to its offsets;
#  3. once everything is consumed, every shard's examples_applied is exactly N, the number
#     of messages in the topic: the step whose answer was lost was not applied twice.
# Each window waits for a checkpoint since the last recovery, so that every recovery goes back
# to one (not to the empty state). A trainer that retried (a PS client with retries > 0)
# would apply the step a second time on shard 1: shard 1 counts more examples than shard 0;
# the trainer's next checkpoint sees the shards disagree and it stops, and the test fails
# with both counters (or, if it went on, at 3 with shard 1 above N, and at 2).
# Every wait is for a condition; its deadline (minutes: a loaded ASan build is 5-10x slower)
# is a hang guard only. MT_LR_CHUNK, MT_LR_SPACING, MT_LR_RATE, MT_LR_WINDOWS, MT_LR_DROP_MS
# change the chunk, the spacing, the rate, the windows and their longest length;
# MT_E2E_KEEP=1 keeps the temporary directory (logs).
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_FAULTPROXY_BIN, MT_SOURCE_DIR;
# kcat.
set -euo pipefail
: "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_SOURCE_DIR:?}"
: "${MT_FAULTPROXY_BIN:?}"
. "$(dirname "$0")/lib.sh"
need_kcat
CHUNK=${MT_LR_CHUNK:-8000} # 4 s of stream per producer run
SPACING=${MT_LR_SPACING:-6400}
RATE=${MT_LR_RATE:-2000}
WINDOWS=${MT_LR_WINDOWS:-3}
DROP_MS=${MT_LR_DROP_MS:-60000} # a hang guard: the window ends with the lost answer
GUARD_S=300 # deadline of every wait: a hang guard, never what the test measures
e2e_init lr-e2e
E2E_LOGS=("$tmp/proxy.log")
# fails at once if the proxy or the trainer exited (the trainer stops when the shards
# disagree on a checkpoint)
check_alive() {
  local st=0
  if ! kill -0 "$px_pid" 2> /dev/null; then
    wait "$px_pid" || st=$?
    fail "the proxy exited with $st"
  fi
  [ -z "${tr_pid:-}" ] || kill -0 "$tr_pid" 2> /dev/null && return 0
  wait "$tr_pid" || st=$?
  fail "the trainer exited with $st ($(grep ERROR "$tmp/tr.err" | tail -1 | sed 's/.*trainer: //'));" \
       "examples_applied: shard 0 $(applied 0), shard 1 $(applied 1)"
}
e2e_check() { check_alive; } # the hook of wait_applied and expect_exact (tests/e2e/lib.sh)
# how many recoveries the trainer logged (trainer/src/coord.c), and how many followed a
# failed step (trainer/main.c)
recoveries() { grep -c "recovered 2 shards" "$tmp/tr.err" 2> /dev/null || true; }
step_failures() { grep -c "training step: .*: recovering" "$tmp/tr.err" 2> /dev/null || true; }
checkpoints() { grep -c "trainer: checkpoint [0-9]*: 2 shards" "$tmp/tr.err" 2> /dev/null || true; }
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<< "$2"; } # field NAME LINE

start_kafka examples:4
conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
model=(--set trainer.hidden=32,16 --set trainer.dim=8 --set ps.admin_token=s3cret
       --set kafka.session_timeout_ms=6000 --set "kafka.bootstrap=$bs")

declare -a port ps_pid
for i in 0 1; do
  "$MT_PS_BIN" --config "$conf" "${model[@]}" --shard "$i" --num-shards 2 --listen 127.0.0.1:0 \
    --port-file "$tmp/ps$i.port" --set "ps.snapshot_dir=$tmp/ps$i" --set ps.snapshot_keep=3 \
    2> "$tmp/ps$i.err" &
  ps_pid[$i]=$!
  pids+=($!)
done
for i in 0 1; do wait_port_file "$tmp/ps$i.port"; port[$i]=$(cat "$tmp/ps$i.port"); done

# shard 1 through the proxy; it opens a window at an ApplyGradientsRequest with gradients
# (field 2, length-delimited) and examples (field 5, varint): the apply of a step
"$MT_FAULTPROXY_BIN" --target "127.0.0.1:${port[1]}" --port-file "$tmp/proxy.port" \
  --drop-ms "$DROP_MS" --until-answer --arm-fields 2:2,5:0 --arm-timeout-ms $((GUARD_S * 1000)) \
  --log "$tmp/proxy.log" 2> "$tmp/proxy.err" &
px_pid=$!
pids+=($!)
wait_port_file "$tmp/proxy.port"
px_port=$(cat "$tmp/proxy.port")
cluster="127.0.0.1:${port[0]},127.0.0.1:$px_port"
say "PS shards on ${port[0]} and ${port[1]}; the trainer reaches shard 1 through port $px_port"

# The stream: chunk j (seed 10 + j) after chunk j - 1, until $tmp/produced exists. Each
# chunk's log is $tmp/gen-J.err; a failed chunk stops the producer (exit 1).
produce() {
  local j=0
  while [ ! -e "$tmp/produced" ]; do
    j=$((j + 1))
    "$MT_CLI_BIN" gen --examples "$CHUNK" --seed $((10 + j)) --users 2000 --items 500 \
      --kafka "$bs" --topic examples --rate "$RATE" > /dev/null 2> "$tmp/gen-$j.err" || exit 1
    grep -q " $CHUNK examples delivered" "$tmp/gen-$j.err" || exit 1
  done
}
say "== producing chunks of $CHUNK examples at $RATE/s until the windows are done; the trainer starts"
produce &
gen_pid=$!
pids+=($!)
"$MT_TRAINER_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" --online \
  --set kafka.group=lost --set trainer.batch_size=500 --set trainer.checkpoint_interval_s=1 \
  --set trainer.recovery_timeout_s=60 --set trainer.progress_interval_ms=0 \
  --report "$tmp/tr.json" > "$tmp/tr.out" 2> "$tmp/tr.err" &
tr_pid=$!
pids+=($!)

no_recovery=()
summary=()
ckpt_mark=0
for k in $(seq "$WINDOWS"); do
  wait_applied $((SPACING * k)) "$GUARD_S"
  # a checkpoint since the last recovery (or the start): the recovery has one to go back to
  end=$(( $(date +%s) + GUARD_S ))
  until [ "$(checkpoints)" -gt "$ckpt_mark" ]; do
    [ "$(date +%s)" -lt "$end" ] || fail "window $k: no checkpoint in $GUARD_S s"
    check_alive
    sleep 0.1
  done
  # an armed proxy waits for the trainer's next apply: the producer runs until the windows
  # are done, so examples are still coming
  kill -0 "$gen_pid" 2> /dev/null || fail "window $k: the producer stopped: $(tail -2 "$tmp"/gen-*.err)"
  before=$(recoveries)
  say "== window $k: trigger at $(applied 0) examples"
  kill -USR1 "$px_pid"
  end=$(( $(date +%s) + GUARD_S + 30 ))
  until grep -qE "window $k closed|trigger $k lapsed" "$tmp/proxy.log"; do
    [ "$(date +%s)" -lt "$end" ] || fail "window $k: no word from the proxy in $((GUARD_S + 30)) s"
    check_alive
    sleep 0.05
  done
  line=$(grep "window $k closed" "$tmp/proxy.log") ||
    fail "trigger $k lapsed: the trainer sent no apply with examples in $GUARD_S s"
  fwd=$(field forwarded_c2s "$line") drop=$(field dropped_s2c "$line")
  lost=$(field lost_responses "$line") matched=$(field matched "$line")
  answer=$(field answer_lost "$line")
  say "window $k: $fwd bytes forwarded to shard 1, $drop bytes of answers dropped" \
      "($lost complete responses, the apply's among them: $answer), matched=$matched"
  [ "$matched" = 1 ] || fail "window $k did not open at an apply: $line"
  [ "$fwd" -gt 0 ] || fail "window $k forwarded nothing to the shard: $line"
  [ "$drop" -gt 0 ] && [ "$lost" -ge 1 ] && [ "$answer" = 1 ] ||
    fail "window $k did not drop the answer to the apply: the shard did not answer it: $line"
  summary+=("window $k: forwarded_c2s=$fwd dropped_s2c=$drop lost_responses=$lost answer_lost=$answer")
  # the step failed: the trainer recovers (judged at the end, after the counts, so that a
  # trainer that retried fails on what it did to the counters); a recovery may retry for
  # trainer.recovery_timeout_s (60 s)
  end=$(( $(date +%s) + GUARD_S ))
  while [ "$(recoveries)" -le "$before" ] && [ "$(date +%s)" -lt "$end" ]; do
    check_alive
    sleep 0.1
  done
  if [ "$(recoveries)" -le "$before" ]; then
    no_recovery+=("$k")
    say "window $k: no recovery followed"
  else
    say "window $k: $(grep "recovered 2 shards" "$tmp/tr.err" | tail -1 | sed 's/.*trainer: //')"
  fi
  ckpt_mark=$(checkpoints)
done

touch "$tmp/produced" # the producer ends with its current chunk
wait "$gen_pid" || fail "the producer failed: $(tail -2 "$tmp"/gen-*.err)"
chunks=$(grep -l " $CHUNK examples delivered" "$tmp"/gen-*.err | wc -l)
N=$((CHUNK * chunks))
say "the producer delivered $chunks chunks: N=$N"
expect_in_topic "$N"
# the trainer checkpointed all N on both shards: it is idle, nothing more can be applied
e2e_settled() { grep -q "trainer: checkpoint [0-9]*: 2 shards, $N examples" "$tmp/tr.err"; }
expect_exact "$N" "$GUARD_S"
[ "${#no_recovery[@]}" -eq 0 ] ||
  fail "no recovery after window(s) ${no_recovery[*]}: the trainer went on (a retry?)"
rec=$(recoveries) steps=$(step_failures)
[ "$steps" -ge "$WINDOWS" ] ||
  fail "$steps failed steps logged for $WINDOWS windows: $(grep "training step" "$tmp/tr.err")"

say "== SIGTERM the trainer (a last checkpoint), the proxy and the shards"
kill -TERM "$tr_pid"
wait "$tr_pid" || fail "the trainer exited with $?"
report=$(cat "$tmp/tr.json")
[ "$(jnum "$report" recoveries)" = "$rec" ] ||
  fail "the report says $(jnum "$report" recoveries) recoveries, the log $rec"
kill -TERM "$px_pid"
wait "$px_pid" || fail "the proxy exited with $?"
for i in 0 1; do kill -TERM "${ps_pid[$i]}"; done
for i in 0 1; do wait "${ps_pid[$i]}" || fail "PS shard $i exited with $?"; done
# the trainer, the proxy and the shards exited by themselves: LeakSanitizer ran in an ASan build
if cat "$tmp"/*.err | grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"; then
  fail "sanitizer reports"
fi
for s in "${summary[@]}"; do say "$s"; done
say "lost responses: N=$N, shard 0 $a0, shard 1 $a1, $WINDOWS windows, $steps failed steps," \
    "$rec recoveries (1 at start), $(jnum "$report" checkpoints) checkpoints: all good"
