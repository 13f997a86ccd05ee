#!/usr/bin/env bash
# monolith-trainer --online end to end, on monolith-kafka-dev (librdkafka's mock cluster):
#  1. `monolith gen --kafka` produces 30,000 Example protobufs to `examples` and kcat (an
#     independent client) 3 garbage messages; a trainer in group g1 trains on exactly the
#     30,000, skips the 3 with their topic/partition/offset in the log, commits, exits 0;
#  2. committed means committed: a second trainer of g1 finds nothing left; after 10,000
#     more examples it trains on exactly those (nothing replayed, nothing lost);
#  3. a trainer of another group g2 reads everything again (40,000 + 3 garbage) and learns
#     (AUC of the last 2,000 examples, progressive, above 0.6); another one, scraped while it
#     trains, serves its Prometheus metrics;
#  4. against a PS shard (sparse and dense parameters there), with the shard's rows > 0, the
#     dcnv2 model (model.type): it learns online too (window AUC above 0.6);
#  5. the multi-task mmoe from Examples of two labels (`monolith gen --tasks 2`: click,
#     conversion): the clicks' window AUC above 0.55 after 40,000 (deepfm: 0.60 here, mmoe
#     learns slower in one pass), a progressive AUC for each task; Examples of one label, in
#     the first topic, are counted as bad messages by it (one label per task), none trained;
#  6. din from Examples with the users' recent clicks (`monolith gen --sequence 10`, slot 7):
#     it learns online (AUC of the last 10,000 above 0.6 after 20,000; a CTR of 0.2 gives the
#     window 2,000 positives: its noise is about 0.01, that of 2,000 examples at 0.05 was 0.04).
# Every run ends on a condition, never on a clock: --max-examples, or --until-caught-up (every
# partition consumed up to its high watermark), so a loaded machine only makes it slower.
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SOURCE_DIR; kcat.
set -euo pipefail
: "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_SOURCE_DIR:?}"
. "$(dirname "$0")/lib.sh"
need_kcat
E2E_KILL=TERM # the daemons stop cleanly at the end
e2e_init trainer-online
start_kafka examples:4,examples2:2,examples3:2
conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
common=(--config "$conf" --set "kafka.bootstrap=$bs" --set kafka.session_timeout_ms=6000
        --set trainer.hidden=32,16 --set trainer.batch_size=500 --set trainer.auc_window=2000
        --set trainer.commit_interval_ms=200)

"$MT_CLI_BIN" gen --examples 30000 --seed 3 --users 1000 --items 300 --kafka "$bs" --topic examples
printf 'garbage-1\nnot a protobuf \xff\xfe\n\x08\x96\x01\n' | kcat -b "$bs" -P -t examples -p 0

echo "== 1. group g1 trains on the 30,000"
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g1 --online --max-examples 30000 \
  --report "$tmp/r1.json" > "$tmp/r1.out" 2> "$tmp/r1.err" || { cat "$tmp/r1.err" >&2; fail "run 1"; }
cat "$tmp/r1.out"
[ "$(json "$tmp/r1.json" examples)" = 30000 ] || fail "run 1: $(cat "$tmp/r1.json")"
# the garbage sits before or among the examples of partition 0: wait until it is seen
[ "$(grep -c "examples/0@[0-9]*: bad message skipped" "$tmp/r1.err")" = 3 ] || {
  # --max-examples may stop before the trainer reaches all of it; a catch-up run takes the rest
  "$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g1 --online --until-caught-up \
    --report "$tmp/r1b.json" > /dev/null 2>> "$tmp/r1.err" || fail "run 1b"
  [ "$(json "$tmp/r1b.json" examples)" = 0 ] || fail "run 1b trained: $(cat "$tmp/r1b.json")"
}
[ "$(grep -c "bad message skipped" "$tmp/r1.err")" = 3 ] || { cat "$tmp/r1.err" >&2; fail "3 bad messages expected"; }

echo "== 2. nothing left for g1; then exactly the 10,000 new ones"
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g1 --online --until-caught-up \
  --report "$tmp/r2.json" > /dev/null 2> "$tmp/r2.err" || { cat "$tmp/r2.err" >&2; fail "run 2"; }
[ "$(json "$tmp/r2.json" examples)" = 0 ] || fail "run 2 replayed: $(cat "$tmp/r2.json")"
"$MT_CLI_BIN" gen --examples 10000 --seed 3 --users 1000 --items 300 --kafka "$bs" --topic examples
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g1 --online --until-caught-up \
  --report "$tmp/r3.json" > /dev/null 2> "$tmp/r3.err" || { cat "$tmp/r3.err" >&2; fail "run 3"; }
[ "$(json "$tmp/r3.json" examples)" = 10000 ] || fail "run 3: $(cat "$tmp/r3.json")"

echo "== 3. group g2 reads everything"
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g2 --online --until-caught-up \
  --report "$tmp/r4.json" > /dev/null 2> "$tmp/r4.err" || { cat "$tmp/r4.err" >&2; fail "run 4"; }
[ "$(json "$tmp/r4.json" examples)" = 40000 ] || fail "run 4: $(cat "$tmp/r4.json")"
[ "$(json "$tmp/r4.json" bad_messages)" = 3 ] || fail "run 4: $(cat "$tmp/r4.json")"
# learned: the AUC of the last auc_window (2,000) examples, scored before training on each; the
# progressive AUC over all 40,000 also counts the cold start, whose length depends on the
# optimizer settings of the configuration, not on the online path under test
auc=$(json "$tmp/r4.json" window_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "window AUC $auc (progressive $(json "$tmp/r4.json" progressive_auc))"
# the Prometheus endpoint of a trainer (group g2m) scraped while it trains: it runs until
# SIGTERM, and the scrape is repeated until it has trained something
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g2m --online \
  --set trainer.metrics_listen=127.0.0.1:0 --report "$tmp/r4m.json" > /dev/null 2> "$tmp/r4m.err" &
t4=$!
wait_until "$E2E_GUARD_S" grep -q "metrics on port" "$tmp/r4m.err" || true # judged below
mport=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/r4m.err" | head -1)
[ -n "$mport" ] || { cat "$tmp/r4m.err" >&2; fail "no metrics port"; }
scrape() {
  exec 3<>"/dev/tcp/127.0.0.1/$mport" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  cat <&3 > "$tmp/metrics.txt"
  exec 3<&-
  grep -q "^monolith_trainer_examples_total [1-9]" "$tmp/metrics.txt"
}
wait_until "$E2E_GUARD_S" scrape || { cat "$tmp/r4m.err" "$tmp/metrics.txt" >&2; fail "metrics: nothing trained"; }
grep -q "^monolith_trainer_window_auc " "$tmp/metrics.txt" || fail "metrics: $(cat "$tmp/metrics.txt")"
grep -q "^monolith_trainer_consumer_lag_messages " "$tmp/metrics.txt" || fail "metrics: $(cat "$tmp/metrics.txt")"
kill -TERM "$t4"
wait "$t4" || { cat "$tmp/r4m.err" >&2; fail "run 4m: exit status $? after SIGTERM"; }

echo "== 4. against a PS shard, the dcnv2 model (model.type)"
"$MT_PS_BIN" --config "$conf" --listen 127.0.0.1:0 --port-file "$tmp/ps.port" \
  --set trainer.hidden=32,16 --set ps.metrics_listen=127.0.0.1:0 2> "$tmp/ps.err" &
pids+=($!)
wait_until "$E2E_GUARD_S" test -s "$tmp/ps.port" ||
  { cat "$tmp/ps.err" >&2; fail "monolith-ps did not start"; }
port=$(cat "$tmp/ps.port")
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g3 --set "cluster.ps=127.0.0.1:$port" \
  --set model.type=dcnv2 --online --max-examples 40000 --report "$tmp/r5.json" > /dev/null \
  2> "$tmp/r5.err" || { cat "$tmp/r5.err" >&2; fail "run 5"; }
[ "$(json "$tmp/r5.json" examples)" = 40000 ] || fail "run 5: $(cat "$tmp/r5.json")"
grep -q "model dcnv2" "$tmp/r5.err" || fail "run 5: not dcnv2: $(head -5 "$tmp/r5.err")"
auc=$(json "$tmp/r5.json" window_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "dcnv2 window AUC $auc (progressive $(json "$tmp/r5.json" progressive_auc))"
rows=$("$MT_CLI_BIN" stats --addr "127.0.0.1:$port" | sed -n 's/.*"rows": *\([0-9]*\).*/\1/p' | head -1)
[ "${rows:-0}" -gt 1000 ] || fail "PS rows: $rows"
echo "== 5. mmoe (model.type) from Examples with a label per task"
"$MT_CLI_BIN" gen --examples 40000 --tasks 2 --seed 4 --users 1000 --items 300 --kafka "$bs" \
  --topic examples2
# scraped once it trained all 40,000 (each task's window AUC on /metrics), then stopped
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g5 --set kafka.examples_topic=examples2 \
  --set model.type=mmoe --set model.experts=2 --set model.expert_width=16 --online \
  --set trainer.auc_window=5000 --set trainer.metrics_listen=127.0.0.1:0 \
  --report "$tmp/r6.json" > /dev/null 2> "$tmp/r6.err" &
t6=$!
wait_until "$E2E_GUARD_S" grep -q "metrics on port" "$tmp/r6.err" || true # judged below
mport=$(sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/r6.err" | head -1)
[ -n "$mport" ] || { cat "$tmp/r6.err" >&2; fail "run 6: no metrics port"; }
scrape_all() { scrape && grep -q "^monolith_trainer_examples_total 40000" "$tmp/metrics.txt"; }
wait_until "$E2E_GUARD_S" scrape_all || { cat "$tmp/r6.err" "$tmp/metrics.txt" >&2; fail "run 6: not all trained"; }
# the gauges follow the progress line (every progress_interval_ms)
scrape_tasks() { scrape && grep -q '^monolith_trainer_task_window_auc{task="1"} 0\.[0-9]*[1-9]' "$tmp/metrics.txt"; }
wait_until "$E2E_GUARD_S" scrape_tasks || fail "run 6 metrics: $(grep task_window "$tmp/metrics.txt")"
grep -q '^monolith_trainer_task_window_auc{task="0"} 0\.' "$tmp/metrics.txt" || fail "run 6: no task 0 gauge"
kill -TERM "$t6"
wait "$t6" || { cat "$tmp/r6.err" >&2; fail "run 6: exit status $? after SIGTERM"; }
python3 - "$tmp/r6.json" <<'PY' || fail "run 6: $(cat "$tmp/r6.json")"
import json, sys
r = json.load(open(sys.argv[1]))
print("mmoe online: progressive AUC per task", r["task_progressive_auc"], "window", r["window_auc"])
assert r["examples"] == 40000 and r["tasks"] == 2 and r["bad_messages"] == 0
assert r["window_auc"] > 0.55 and r["task_progressive_auc"][0] == r["progressive_auc"]
assert 0.45 < r["task_progressive_auc"][1] <= 1  # ~250 conversions: a noisy figure
PY
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g6 --set model.type=mmoe --online \
  --until-caught-up --report "$tmp/r7.json" > /dev/null 2> "$tmp/r7.err" \
  || { cat "$tmp/r7.err" >&2; fail "run 7"; }
[ "$(json "$tmp/r7.json" examples)" = 0 ] || fail "run 7 trained one-label examples: $(cat "$tmp/r7.json")"
[ "$(json "$tmp/r7.json" bad_messages)" = 40003 ] || fail "run 7: $(cat "$tmp/r7.json")"
grep -q "1 label, the model has 2 tasks" "$tmp/r7.err" || fail "run 7: $(head -5 "$tmp/r7.err")"

echo "== 6. din (model.type) from Examples with the users' recent clicks"
"$MT_CLI_BIN" gen --examples 20000 --ctr 0.2 --sequence 10 --seed 5 --users 1000 --items 300 \
  --kafka "$bs" --topic examples3
"$MT_TRAINER_BIN" "${common[@]}" --set kafka.group=g7 --set kafka.examples_topic=examples3 \
  --set trainer.slots=1,2,3,4,5,6,7 --set model.type=din --set model.sequence_slot=7 \
  --set model.sequence_query=2 --set model.sequence_length=10 --set trainer.auc_window=10000 \
  --online --until-caught-up \
  --report "$tmp/r8.json" > /dev/null 2> "$tmp/r8.err" || { cat "$tmp/r8.err" >&2; fail "run 8"; }
grep -q "model din" "$tmp/r8.err" || fail "run 8: not din: $(head -5 "$tmp/r8.err")"
[ "$(json "$tmp/r8.json" examples)" = 20000 ] || fail "run 8: $(cat "$tmp/r8.json")"
[ "$(json "$tmp/r8.json" bad_messages)" = 0 ] || fail "run 8: $(cat "$tmp/r8.json")"
auc=$(json "$tmp/r8.json" window_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "run 8: din window AUC $auc is not above 0.6"
echo "din online: window AUC $auc"
echo "trainer online: all good"
