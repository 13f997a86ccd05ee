#!/usr/bin/env bash
# Consistent checkpoints end to end (issue #7, docs/checkpoint.md), counted: on
# monolith-kafka-dev, two monolith-ps shards with snapshot stores (and their own periodic
# snapshots on, which coordination must switch off) and monolith-trainer --online with
# trainer.checkpoint_interval_s = 1 and pipelined steps (trainer.pipelined: the apply of a
# step in flight while the next computes), while `monolith gen --kafka --rate` produces N examples:
#  1. kill -9 PS shard 1 mid-stream and restart it on the same address: the trainer notices,
#     rolls both shards back to the last complete checkpoint and the consumer to its offsets;
#  2. kill -9 the trainer mid-stream and start another: it recovers the same way; then a
#     third starts while the second runs: it takes the cluster over (fencing: a higher
#     coordinator epoch) and the second, fenced, stops with exit status 3;
#  3. once everything is consumed (N, then EXTRA more produced for trainer 3 alone), every
#     shard's examples_applied (the examples its state reflects,
#     ApplyGradientsRequest.examples) is exactly N + EXTRA, the number of messages in the
#     topic: nothing lost, nothing applied twice to the restored state;
#  4. the trainer stops (SIGTERM: a last checkpoint); shard 0 is killed -9 and restarted with
#     no trainer around: it comes back from that checkpoint with exactly N + EXTRA.
# A monolith-serving replica follows the shards throughout, under Predict load
# (monolith-loadgen), and is itself killed -9 and restarted mid-stream: at the end it holds
# as many rows as the shards together and their dense version (it resynced after every
# restore and after its own restart).
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SERVING_BIN, MT_LOADGEN_BIN,
# MT_SOURCE_DIR; kcat.
set -euo pipefail
: "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_SOURCE_DIR:?}"
: "${MT_SERVING_BIN:?}" "${MT_LOADGEN_BIN:?}"
. "$(dirname "$0")/lib.sh"
need_kcat
N=${MT_CKPT_EXAMPLES:-24000}
RATE=${MT_CKPT_RATE:-2000}
EXTRA=${MT_CKPT_EXTRA:-4000} # produced once trainer 3 took over
e2e_init ckpt-e2e
# stats of shard i: "examples_applied rows dense_version incarnation last_checkpoint_id", or
# nothing while it does not answer
stats() {
  local s
  s=$("$MT_CLI_BIN" stats --addr "127.0.0.1:${port[$1]}" 2> /dev/null) || return 0
  echo "$(jnum "$s" examples_applied) $(jnum "$s" rows) $(jnum "$s" dense_version)" \
       "$(jnum "$s" incarnation) $(jnum "$s" last_checkpoint_id)"
}
start_kafka examples:4,features:4
conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
model=(--set trainer.hidden=32,16 --set trainer.dim=8 --set ps.admin_token=s3cret
       --set kafka.session_timeout_ms=6000 --set "kafka.bootstrap=$bs")

declare -a port ps_pid
start_ps() { # start_ps I [PORT]
  local i=$1 listen=127.0.0.1:${2:-0}
  rm -f "$tmp/ps$i.port"
  "$MT_PS_BIN" --config "$conf" "${model[@]}" --shard "$i" --num-shards 2 --listen "$listen" \
    --port-file "$tmp/ps$i.port" --set "ps.snapshot_dir=$tmp/ps$i" --set ps.snapshot_interval_s=1 \
    --set ps.snapshot_keep=3 2>> "$tmp/ps$i.err" &
  ps_pid[$i]=$!
  pids+=($!)
  wait_port_file "$tmp/ps$i.port"
  port[$i]=$(cat "$tmp/ps$i.port")
}
start_ps 0
start_ps 1
cluster="127.0.0.1:${port[0]},127.0.0.1:${port[1]}"
say "PS shards on ${port[0]} and ${port[1]}"

start_trainer() { # start_trainer NAME
  "$MT_TRAINER_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" --online \
    --set kafka.group=ckpt --set trainer.batch_size=500 --set trainer.checkpoint_interval_s=1 \
    --set trainer.pipelined=true \
    --set trainer.recovery_timeout_s=60 --set trainer.progress_interval_ms=0 \
    --set trainer.metrics_listen=127.0.0.1:0 --report "$tmp/$1.json" \
    > "$tmp/$1.out" 2> "$tmp/$1.err" &
  tr_pid=$!
  pids+=($!)
}

# the serving replica and its load
"$MT_SERVING_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" \
  --listen 127.0.0.1:0 --port-file "$tmp/sv.port" --set serving.sync_interval_ms=500 \
  --set serving.dense_sync_interval_ms=500 --set serving.metrics_listen=127.0.0.1:0 \
  --set serving.log_sample_rate=0 2> "$tmp/sv.err" &
sv_pid=$!
pids+=($!)
wait_port_file "$tmp/sv.port"
sv_port=$(cat "$tmp/sv.port")

say "== producing $N examples at $RATE/s; the trainer starts"
"$MT_CLI_BIN" gen --examples "$N" --seed 11 --users 2000 --items 500 --kafka "$bs" \
  --topic examples --rate "$RATE" > /dev/null 2> "$tmp/gen.err" &
gen_pid=$!
pids+=($!)
start_trainer tr1
"$MT_LOADGEN_BIN" --serving "127.0.0.1:$sv_port" --rate 50 --duration-s 600 --progress-s 0 \
  --users 2000 --items 500 --report "$tmp/loadgen.json" > /dev/null 2> "$tmp/loadgen.err" &
lg_pid=$!
pids+=($!)

wait_applied $((N / 5)) "$E2E_GUARD_S"
say "== 1. kill -9 PS shard 1 at $(applied 0) examples; restart it on port ${port[1]}"
# what trainer 1 logged of failed steps and checkpoints so far
tr1_failures() { grep -cE "recovering|checkpoint failed" "$tmp/tr1.err" || true; }
tr1_noticed() { [ "$(tr1_failures)" -gt "$failures" ]; }
failures=$(tr1_failures)
kill -9 "${ps_pid[1]}"
wait "${ps_pid[1]}" 2> /dev/null || true
# restarted once trainer 1 noticed the shard is gone (a step or a checkpoint failed), not
# after a pause: so the recovery below is one from a shard that went away
wait_until "$E2E_GUARD_S" tr1_noticed ||
  fail "trainer 1 did not notice in $E2E_GUARD_S s that PS shard 1 was killed"
start_ps 1 "${port[1]}"
wait_applied $((N * 2 / 5)) "$E2E_GUARD_S"

say "== serving: kill -9 under load at $(applied 0) examples; restart it on port $sv_port"
kill -9 "$sv_pid"
wait "$sv_pid" 2> /dev/null || true
"$MT_SERVING_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" \
  --listen "127.0.0.1:$sv_port" --port-file "$tmp/sv2.port" --set serving.sync_interval_ms=500 \
  --set serving.dense_sync_interval_ms=500 --set serving.metrics_listen=127.0.0.1:0 \
  --set serving.log_sample_rate=0 2> "$tmp/sv2.err" &
sv_pid=$!
pids+=($!)
wait_port_file "$tmp/sv2.port"

wait_applied $((N * 3 / 5)) "$E2E_GUARD_S"
say "== 2. kill -9 the trainer at $(applied 0) examples; start another"
kill -9 "$tr_pid"
wait "$tr_pid" 2> /dev/null || true
grep -q "recovered 2 shards" "$tmp/tr1.err" || fail "trainer 1 never recovered"
[ "$(grep -c "recovered 2 shards" "$tmp/tr1.err")" -ge 2 ] ||
  fail "trainer 1 did not recover after the shard's restart"
start_trainer tr2
tr2_pid=$tr_pid

wait_applied $((N * 4 / 5)) "$E2E_GUARD_S"
say "== 2b. a second trainer (tr3) starts while tr2 runs, at $(applied 0) examples: it takes"
say "   the cluster over (a higher coordinator epoch) and tr2, fenced, must stop"
start_trainer tr3
end=$(( $(date +%s) + E2E_GUARD_S ))
while kill -0 "$tr2_pid" 2> /dev/null; do
  [ "$(date +%s)" -lt "$end" ] || fail "trainer 2 still runs $E2E_GUARD_S s after trainer 3 took over"
  sleep 0.2
done
st=0
wait "$tr2_pid" || st=$?
[ "$st" -eq 3 ] || fail "fenced trainer 2 exited with $st, expected 3"
# (a step, a checkpoint, an idle check or a recovery: whichever met the fence first)
grep -qE "stopping: .*fenced" "$tmp/tr2.err" || fail "trainer 2 did not say it was fenced"
say "trainer 2 stopped: $(grep -m1 -E "stopping: .*fenced" "$tmp/tr2.err" | sed 's/.*stopping: //')"

wait "$gen_pid" || fail "the producer failed"
grep -q " $N examples delivered" "$tmp/gen.err" || fail "producer: $(cat "$tmp/gen.err")"
say "== $EXTRA more examples for trainer 3 alone"
"$MT_CLI_BIN" gen --examples "$EXTRA" --seed 12 --users 2000 --items 500 --kafka "$bs" \
  --topic examples --rate "$RATE" > /dev/null 2> "$tmp/gen2.err" || fail "the second producer failed"
grep -q " $EXTRA examples delivered" "$tmp/gen2.err" || fail "producer: $(cat "$tmp/gen2.err")"
N=$((N + EXTRA))
expect_in_topic "$N"
say "== 3. every example exactly once"
# trainer 3 checkpointed all N on both shards: it is idle, nothing more can be applied
e2e_settled() { grep -q "trainer: checkpoint [0-9]*: 2 shards, $N examples" "$tmp/tr3.err"; }
expect_exact "$N" "$E2E_GUARD_S"

say "== 4. SIGTERM the trainer (a last checkpoint); kill -9 shard 0 and restart it alone"
kill -TERM "$tr_pid"
wait "$tr_pid" || fail "trainer 3 exited with $?"
grep -q "recovered 2 shards" "$tmp/tr3.err" || fail "trainer 3 did not recover at its start"
ckpts=$(jnum "$(cat "$tmp/tr3.json")" checkpoints)
[ "${ckpts:-0}" -ge 1 ] || fail "trainer 3 wrote no checkpoint: $(cat "$tmp/tr3.json")"
read -r _ rows0 dv0 _ last0 <<< "$(stats 0)"
read -r _ rows1 _ _ _ <<< "$(stats 1)"
kill -9 "${ps_pid[0]}"
wait "${ps_pid[0]}" 2> /dev/null || true
start_ps 0 "${port[0]}"
read -r e0 r0 d0 _ l0 <<< "$(stats 0)"
say "shard 0 restarted from checkpoint $l0: $e0 examples, $r0 rows"
[ "$l0" = "$last0" ] || fail "restarted from checkpoint $l0, the last one was $last0"
[ "$e0" -eq "$N" ] || fail "restarted shard 0 reflects $e0 examples, not $N"
[ "$r0" -eq "$rows0" ] || fail "restarted shard 0 has $r0 rows, $rows0 before"
[ "$d0" = "$dv0" ] || fail "restarted shard 0 has dense version $d0, $dv0 before"

say "== serving: it follows the shards (rows of both, dense version of shard 0)"
sv_mport=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/sv2.err" | head -1)
[ -n "$sv_mport" ] || fail "serving: no metrics port"
end=$(( $(date +%s) + E2E_GUARD_S ))
want_rows=$((rows0 + rows1))
while :; do
  svr=$(metric "$sv_mport" monolith_serving_rows)
  svd=$(metric "$sv_mport" monolith_serving_dense_version)
  [ "${svr%.*}" = "$want_rows" ] && [ "${svd%.*}" = "$dv0" ] && break
  [ "$(date +%s)" -lt "$end" ] ||
    fail "serving holds ${svr:-?} rows (dense ${svd:-?}), the shards $want_rows (dense $dv0)"
  sleep 0.5
done
served=$(metric "$sv_mport" monolith_serving_predict_requests_total)
kill -TERM "$lg_pid"
wait "$lg_pid" 2> /dev/null || true
lg=$(cat "$tmp/loadgen.json" 2> /dev/null || true)
say "loadgen: $(jnum "$lg" requests) requests, $(jnum "$lg" ok) answered, $(jnum "$lg" errors)" \
    "errors; the restarted replica answered ${served:-0}"
[ "${served%.*}" -gt 20 ] || fail "the restarted replica answered ${served:-0} Predicts: $lg"
say "== SIGTERM the shards: they exit 0 without a local snapshot (coordinated)"
for i in 0 1; do kill -TERM "${ps_pid[$i]}"; done
for i in 0 1; do wait "${ps_pid[$i]}" || fail "PS shard $i exited with $?"; done
# (in each life of a shard, until the trainer restores it or has it write a cluster
# checkpoint, it is not coordinated yet and may write one: a restart with no checkpoint)
for i in 0 1; do
  late=$(awk '/serving on port/ { c = 0 } /: restored |consistent checkpoint/ { c = 1 }
              c && /local checkpoint/' "$tmp/ps$i.err")
  [ -z "$late" ] || fail "coordinated shard $i wrote a local snapshot: $late"
done
# the daemons that exited by themselves (trainer 2, loadgen, the shards) ran LeakSanitizer in
# an ASan build
if cat "$tmp"/*.err | grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"; then
  fail "sanitizer reports"
fi
say "checkpoints: all good"
