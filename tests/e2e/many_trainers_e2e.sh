#!/usr/bin/env bash
# Many trainers, exactly once (docs/checkpoint.md, "Many trainers: idempotent applies"),
# counted: on monolith-kafka-dev (examples: 6 partitions), two monolith-ps shards taking
# their own snapshots every second (one whole in 3, the others incremental:
# ps.snapshot_full_every), and three monolith-trainer --online in one group with
# trainer.idempotent (covered steps; trainers 2 and 4 pipelined: trainer.pipelined), while `monolith gen --kafka --rate` produces N examples
# and kcat 3 garbage messages:
#  1. kill -9 trainer 1 mid-stream: its partitions move to the others, which start each one
#     at the lowest mark of the shards;
#  2. kill -9 PS shard 1 and restart it on its address: it comes back from its last snapshot
#     with older marks, refuses the next steps (out of order) unless the trainers read the
#     marks first, and is re-fed from its marks while shard 0 skips what it holds;
#  3. a fourth trainer joins mid-stream (a rebalance); then trainer 2 is frozen (SIGSTOP)
#     past its session timeout, its partitions move, and it is thawed: a zombie owner;
#  4. once everything is consumed, each shard's examples_applied is exactly N (garbage holds
#     no example) and each shard's marks are the ends of the 6 partitions: nothing lost,
#     nothing applied twice;
#  5. both shards kill -9'd and restarted, EXTRA more examples: exactly N + EXTRA again;
#  6. shard 1 loses its disk (kill -9, snapshots removed): re-fed from the log start while
#     shard 0 skips, exactly N + EXTRA on both with no new example;
#     the surviving trainers each trained a share.
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SOURCE_DIR; kcat.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
EXTRA=${MT_MANY_EXTRA:-4000} # produced after both shards restarted
many_init many-trainers
# the sum of shard I's sparse marks over the examples partitions (its /metrics)
marks_sum() {
  local mp; mp=$(metrics_port "$tmp/ps$1.err")
  [ -n "$mp" ] || { echo 0; return; }
  exec 3<>"/dev/tcp/127.0.0.1/$mp" || { echo 0; return; }
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  awk '/^monolith_ps_mark\{.*kind="sparse",topic="examples"/ { s += $2 } END { print s + 0 }' <&3
  exec 3<&-
}

declare -a port ps_pid tr_pids
start_ps() { # start_ps I [PORT [SNAPSHOT_INTERVAL_S]]
  local i=$1 listen=127.0.0.1:${2:-0}
  rm -f "$tmp/ps$i.port"
  "$MT_PS_BIN" --config "$conf" "${model[@]}" --shard "$i" --num-shards 2 --listen "$listen" \
    --port-file "$tmp/ps$i.port" --set "ps.snapshot_dir=$tmp/ps$i" \
    --set "ps.snapshot_interval_s=${3:-1}" \
    --set ps.snapshot_keep=3 --set ps.snapshot_full_every=3 \
    --set ps.metrics_listen=127.0.0.1:0 2>> "$tmp/ps$i.err" &
  ps_pid[$i]=$!
  pids+=($!)
  wait_port_file "$tmp/ps$i.port"
  port[$i]=$(cat "$tmp/ps$i.port")
}
start_ps 0
start_ps 1 0 0 # shard 1 snapshots when told (below), so that it comes back behind
cluster="127.0.0.1:${port[0]},127.0.0.1:${port[1]}"
say "PS shards on ${port[0]} and ${port[1]}"
start_trainer() { # start_trainer K: trainers 2 and 4 pipeline their covered steps
  local pipe=false
  [ $(($1 % 2)) -eq 0 ] && pipe=true
  "$MT_TRAINER_BIN" --config "$conf" "${model[@]}" --set "cluster.ps=$cluster" --online \
    --set kafka.group=many --set trainer.idempotent=true --set trainer.dense_sync_batches=1 \
    --set trainer.pipelined=$pipe \
    --set trainer.batch_size=200 --set trainer.progress_interval_ms=0 \
    --report "$tmp/tr$1.json" > "$tmp/tr$1.out" 2> "$tmp/tr$1.err" &
  tr_pids[$1]=$!
  pids+=($!)
}

# Two fifths first, the rest once shard 1 has snapshotted: however late the trainers start
# (they may catch up on the whole first part at once), shard 1 goes on past its snapshot
# before step 2 kills it, so that it comes back behind and is re-fed.
N2=$((N * 3 / 5))
many_produce $((N - N2))
say "3 trainers start"
for k in 1 2 3; do start_trainer "$k"; done

wait_applied $((N / 10))
# shard 1 snapshots when told: now, early, so that it has gone on well past it when it is
# killed in step 2 and comes back behind
"$MT_CLI_BIN" snapshot --addr "127.0.0.1:${port[1]}" > "$tmp/snap.json" 2> "$tmp/snap.err" ||
  fail "monolith snapshot: $(cat "$tmp/snap.err")"
snap=$(json "$tmp/snap.json" examples_applied)
say "shard 1 snapshot at ${snap:-?} examples"
[ -n "$snap" ] || fail "no examples_applied in the snapshot's answer: $(cat "$tmp/snap.json")"
many_produce "$N2" 23

wait_applied $((N / 5))
say "== 1. kill -9 trainer 1 at $(applied 0) examples"
kill -9 "${tr_pids[1]}"
wait "${tr_pids[1]}" 2> /dev/null || true

wait_applied $((N * 2 / 5))
shard1_past_snapshot() { local a; a=$(applied 1); [ -n "$a" ] && [ "$a" -ge $((snap + N / 10)) ]; }
wait_until "$E2E_GUARD_S" shard1_past_snapshot ||
  fail "shard 1 did not get $((N / 10)) examples past its snapshot ($snap; at $(applied 1))"
say "== 2. kill -9 PS shard 1 at $(applied 1) examples (its snapshot: $snap); restart it"
before=$(applied 1)
kill -9 "${ps_pid[1]}"
wait "${ps_pid[1]}" 2> /dev/null || true
start_ps 1 "${port[1]}"
# what it restored (its log: the trainers may have re-fed it some already)
after=$(sed -n 's/.*shard 1: restored checkpoint [0-9]*: [0-9]* rows, \([0-9]*\) examples.*/\1/p' \
  "$tmp/ps1.err" | tail -1)
[ "$after" = "$snap" ] || fail "shard 1 came back with ${after:-?} examples, its snapshot holds $snap"
say "shard 1 had $before examples, is back with $after (its snapshot)"

wait_applied $((N * 3 / 5))
say "== 3. trainer 4 joins at $(applied 0) examples"
start_trainer 4

# a zombie: trainer 2 frozen past its session timeout while the stream goes on (its
# partitions move to trainers 3 and 4), then thawed: the step it had in hand it sends as an
# owner that is no longer one (skipped or refused out of order by the shards: never applied
# twice, which the exact counts below check)
last_held() { # the partition count of trainer K's last assignment
  sed -n 's/.*trainer: partitions (\([0-9]*\)).*/\1/p' "$tmp/tr$1.err" | tail -1
}
others_hold_all() { [ $(( $(last_held 3) + $(last_held 4) )) -eq 6 ]; }
say "== 3b. trainer 2 frozen (SIGSTOP) at $(applied 0) examples until trainers 3 and 4 hold every partition"
kill -STOP "${tr_pids[2]}"
wait_until "$E2E_GUARD_S" others_hold_all ||
  fail "trainer 2's partitions did not move while it was frozen"
zlines=$(wc -l < "$tmp/tr2.err")
say "thawed at $(applied 0) examples"
kill -CONT "${tr_pids[2]}"

many_produced
total=$((N + GARBAGE))
say "== 4. every example exactly once, on both shards"
# settled: both shards' marks reach the end of every partition (the topic's $total
# messages): no step can be applied any more
e2e_settled() { [ "$(marks_sum 0)" -eq "$total" ] && [ "$(marks_sum 1)" -eq "$total" ]; }
expect_exact "$N" "$E2E_GUARD_S"
say "shards: $a0 / $a1 examples, marks $(marks_sum 0) / $(marks_sum 1) of $total messages"
[ "$a0" -eq "$N" ] && [ "$a1" -eq "$N" ] || fail "shards reflect $a0 / $a1 examples, not $N"

# and shard 0 skipped the steps that re-fed shard 1 (it held them)
mp0=$(metrics_port "$tmp/ps0.err")
skipped=$(metric "$mp0" 'monolith_ps_skipped_total{shard="0",kind="sparse"}')
say "shard 0 skipped ${skipped:-0} steps it held while shard 1 was re-fed"
[ "${skipped%.*}" -gt 0 ] || fail "shard 0 skipped no step while shard 1 was re-fed"
# one snapshot in 3 is whole (ps.snapshot_full_every), so the restarts above and below come
# back through chains of incremental ones as often as not
inc=$(metric "$mp0" 'monolith_ps_snapshots_incremental_total{shard="0"}')
whole=$(metric "$mp0" 'monolith_ps_snapshots_total{shard="0"}')
say "shard 0: ${whole:-0} snapshots, ${inc:-0} of them incremental"
[ "${inc%.*}" -gt 0 ] || fail "shard 0 wrote no incremental snapshot"

say "== 5. $EXTRA more examples; mid-stream, kill -9 both shards and restart them"
"$MT_CLI_BIN" gen --examples "$EXTRA" --seed 22 --users 2000 --items 500 --kafka "$bs" \
  --topic examples --rate "$RATE" > /dev/null 2> "$tmp/gen2.err" &
gen_pid=$!
pids+=($!)
wait_applied $((N + EXTRA / 3))
for i in 0 1; do kill -9 "${ps_pid[$i]}"; done
for i in 0 1; do wait "${ps_pid[$i]}" 2> /dev/null || true; done
for i in 0 1; do start_ps "$i" "${port[$i]}"; done
say "back with $(applied 0) / $(applied 1) examples (their last snapshots)"
wait "$gen_pid" || fail "the second producer failed"
grep -q " $EXTRA examples delivered" "$tmp/gen2.err" || fail "producer: $(cat "$tmp/gen2.err")"
N=$((N + EXTRA)) total=$((total + EXTRA))
expect_in_topic "$total"
expect_exact "$N" "$E2E_GUARD_S"
say "shards: $a0 / $a1 examples, marks $(marks_sum 0) / $(marks_sum 1) of $total messages"
[ "$a0" -eq "$N" ] && [ "$a1" -eq "$N" ] || fail "shards reflect $a0 / $a1 examples, not $N"

say "== 6. shard 1 loses its disk: kill -9, its snapshots removed, restarted empty"
skipped_0() { metric "$(metrics_port "$tmp/ps0.err")" 'monolith_ps_skipped_total{shard="0",kind="sparse"}'; }
skipped_before=$(skipped_0)
kill -9 "${ps_pid[1]}"
wait "${ps_pid[1]}" 2> /dev/null || true
rm -rf "$tmp/ps1"
start_ps 1 "${port[1]}"
grep -q "shard 1: no checkpoint: starting empty" "$tmp/ps1.err" ||
  fail "shard 1 did not start empty: $(tail -2 "$tmp/ps1.err")"
# no new example comes: the trainers find it behind by themselves and re-feed its whole
# history from the log start, while shard 0 skips every step
expect_exact "$N" "$E2E_GUARD_S"
skipped_after=$(skipped_0)
say "shards: $a0 / $a1 examples, marks $(marks_sum 0) / $(marks_sum 1) of $total messages;" \
    "shard 0 skipped $(( ${skipped_after%.*} - ${skipped_before%.*} )) steps meanwhile"
[ "${skipped_after%.*}" -gt "${skipped_before%.*}" ] ||
  fail "shard 0 skipped no step while shard 1 was re-fed from the log start"

say "== the trainers: shares, refusals after the shard's restart, skips"
for k in 2 3 4; do kill -TERM "${tr_pids[$k]}"; done
for k in 2 3 4; do wait "${tr_pids[$k]}" || fail "trainer $k exited with $?"; done
trained=0
for k in 2 3 4; do
  e=$(json "$tmp/tr$k.json" examples)
  say "trainer $k: ${e:-0} examples; $(grep -c "partitions (" "$tmp/tr$k.err") assignments"
  trained=$((trained + ${e:-0}))
done
for k in 2 4; do
  grep -q "pipelined covered steps" "$tmp/tr$k.err" || fail "trainer $k did not pipeline its steps"
done
# trainer 4 joined last: it must have owned partitions once the group settled
grep -qE "partitions \([1-9]" "$tmp/tr4.err" || fail "trainer 4 never owned a partition"
refused=$(cat "$tmp"/tr*.err | grep -c "a shard refused the step" || true)
say "steps refused (a shard's marks moved): $refused; examples trained by the survivors: $trained"
say "trainer 2 after its thaw: $(tail -n +$((zlines + 1)) "$tmp/tr2.err" | grep -cE "refused the step|partitions \(") lines of refusals and assignments"
# shard 1 came back behind where it was: it refused the steps that went on from there
[ "$after" -lt "$before" ] || fail "shard 1 came back with $after examples, it had $before"
# (it refuses the steps that go on from where it was, unless the trainers read the marks
# first: a rebalance or a retry while it was away; either way it is re-fed from its marks)
if cat "$tmp"/*.err | grep -qE "ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:"; then
  fail "sanitizer reports"
fi
say "many trainers: all good"
