#!/usr/bin/env bash
# Sharded serving with real processes (docs/serving.md, "Sharded serving"): 2 monolith-ps
# shards trained by monolith-trainer (batch, 6,000 examples of `monolith gen`), and four
# monolith-serving nodes:
#   C holds both shards;  A holds shard 0, peers B and C;  B holds shard 1, peer C only;
#   Z holds shard 1, peer C only, serving.peer_failure = zeros.
#  1. `monolith predict` on A, B, C and Z gives the same scores within 1e-5;
#  2. each node's /metrics counts only its shards' rows (the PS shards' own counts);
#  3. C is killed with SIGKILL while every node answers Predicts in a loop: B (fail) then
#     answers UNAVAILABLE (exit 1), Z (zeros) keeps answering and counts the ids it read as
#     zeros, A keeps answering through B (at most the calls in flight at the kill fail);
#  4. C restarted on its address is found again: B answers again, with C's scores.
# Needs MT_PS_BIN, MT_TRAINER_BIN, MT_SERVING_BIN, MT_CLI_BIN, MT_SOURCE_DIR.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_init sharded-serving
py=/usr/bin/python3

conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
small=(--set trainer.hidden=32,16 --set trainer.batch_size=200 --set trainer.progress_interval_ms=0)
"$MT_CLI_BIN" gen --examples 6000 --seed 5 --users 300 --items 100 > "$tmp/train.tsv"
ps=""
for i in 0 1; do
  "$MT_PS_BIN" --config "$conf" "${small[@]}" --shard "$i" --num-shards 2 --listen 127.0.0.1:0 \
    --port-file "$tmp/ps$i.port" --set ps.expire_interval_ms=0 2> "$tmp/ps$i.err" &
  pids+=($!)
  wait_port_file "$tmp/ps$i.port"
  ps="$ps${ps:+,}127.0.0.1:$(cat "$tmp/ps$i.port")"
done
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" --train "$tmp/train.tsv" \
  > "$tmp/tr.out" 2> "$tmp/tr.err" || fail "the trainer exited $?"

# A port no one listens on, below the kernel's ephemeral range (32768-60999 by default), where
# every port-0 listener and outgoing connection of this machine takes its ports: one drawn
# from inside it was once taken by another process between this check and the node's bind.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}
declare -A port pid
for n in A B C Z; do port[$n]=$(free_port); done
addr() { echo "127.0.0.1:${port[$1]}"; }
# node NAME [--set k=v]...: a serving daemon on its port, metrics on a port of its own
node() {
  local n=$1
  shift
  rm -f "$tmp/$n.port"
  "$MT_SERVING_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" \
    --listen "$(addr "$n")" --port-file "$tmp/$n.port" --set serving.sync_interval_ms=200 \
    --set serving.dense_sync_interval_ms=200 --set serving.log_sample_rate=0 \
    --set serving.metrics_listen=127.0.0.1:0 --set serving.peer_refresh_ms=200 \
    --set serving.peer_timeout_ms=5000 "$@" 2>> "$tmp/$n.err" &
  pids+=($!)
  pid[$n]=$!
  wait_port_file "$tmp/$n.port"
}
node C
node A --set serving.shards=0 --set "serving.peers=$(addr B),$(addr C)"
node B --set serving.shards=1 --set "serving.peers=$(addr C)"
node Z --set serving.shards=1 --set "serving.peers=$(addr C)" --set serving.peer_failure=zeros
ready() { "$MT_CLI_BIN" health --addr "$(addr "$1")" > /dev/null 2>&1; }
for n in C A B Z; do wait_until "$E2E_GUARD_S" ready "$n" || fail "node $n never became SERVING"; done
mport() { sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/$1.err" | tail -1; }
say "PS $ps trained; serving A $(addr A) B $(addr B) C $(addr C) Z $(addr Z)"

req=(predict --user 1:17,3:2,5:9 --candidate 5=2:5,4:3,6:1 --candidate 6=2:6,4:1
     --candidate 77=2:77,4:2,6:2,6:3 --candidate 8=2:8,4:4,6:5)
pred() { "$MT_CLI_BIN" "${req[@]}" --addr "$(addr "$1")" > "$tmp/$1.json" 2> "$tmp/$1.perr"; }
same() { # same FILE...: the scores of every file equal the first's within 1e-5
  "$py" - "$@" <<'EOF'
import json, sys
s = [json.load(open(f))["scores"] for f in sys.argv[1:]]
assert all(len(x) == 4 for x in s), s
assert all(abs(a - b) <= 1e-5 for x in s[1:] for a, b in zip(s[0], x)), s
EOF
}
all_same() {
  for n in A B C Z; do pred "$n" || return 1; done
  same "$tmp/C.json" "$tmp/A.json" "$tmp/B.json" "$tmp/Z.json" 2> /dev/null
}

say "== 1. the same scores from every node"
wait_until "$E2E_GUARD_S" all_same || fail "the nodes' scores differ: $(cat "$tmp"/[ABCZ].json)"
say "scores: $(cat "$tmp/C.json")"

say "== 2. each node's rows are its shards'"
rows0=$("$MT_CLI_BIN" stats --addr "127.0.0.1:$(cat "$tmp/ps0.port")" | sed -n 's/.*"rows":\([0-9]*\).*/\1/p')
rows1=$("$MT_CLI_BIN" stats --addr "127.0.0.1:$(cat "$tmp/ps1.port")" | sed -n 's/.*"rows":\([0-9]*\).*/\1/p')
[ -n "$rows0" ] && [ "$rows0" -gt 0 ] && [ -n "$rows1" ] && [ "$rows1" -gt 0 ] || fail "PS rows: '$rows0' '$rows1'"
rows_ok() {
  [ "$(metric "$(mport A)" monolith_serving_rows)" = "$rows0" ] &&
    [ "$(metric "$(mport B)" monolith_serving_rows)" = "$rows1" ] &&
    [ "$(metric "$(mport C)" monolith_serving_rows)" = "$((rows0 + rows1))" ]
}
wait_until "$E2E_GUARD_S" rows_ok ||
  fail "rows: A $(metric "$(mport A)" monolith_serving_rows) B $(metric "$(mport B)" monolith_serving_rows) C $(metric "$(mport C)" monolith_serving_rows); PS $rows0 + $rows1"
say "rows: A $rows0 (shard 0), B $rows1 (shard 1), C $((rows0 + rows1))"

say "== 3. C killed (SIGKILL) under load"
# loop NAME: Predicts on NAME until $tmp/stop exists; one exit code per line in $tmp/NAME.codes
loop() {
  local n=$1 rc
  : > "$tmp/$n.codes"
  while [ ! -e "$tmp/stop" ]; do
    rc=0
    "$MT_CLI_BIN" "${req[@]}" --addr "$(addr "$n")" > /dev/null 2>> "$tmp/$n.lerr" || rc=$?
    echo "$rc" >> "$tmp/$n.codes"
  done
}
loops=()
for n in A B Z; do
  loop "$n" &
  loops+=($!)
done
count() { grep -cx "$2" "$tmp/$1.codes" 2> /dev/null || true; }
going() { [ "$(count A 0)" -ge 5 ] && [ "$(count B 0)" -ge 5 ] && [ "$(count Z 0)" -ge 5 ]; }
wait_until "$E2E_GUARD_S" going || fail "the loops did not start"
kill -9 "${pid[C]}"
wait "${pid[C]}" 2> /dev/null || true
a0=$(wc -l < "$tmp/A.codes") z0=$(wc -l < "$tmp/Z.codes") b0=$(wc -l < "$tmp/B.codes")
after() {
  [ "$(wc -l < "$tmp/A.codes")" -ge $((a0 + 10)) ] && [ "$(wc -l < "$tmp/Z.codes")" -ge $((z0 + 10)) ] &&
    [ "$(tail -n +"$((b0 + 1))" "$tmp/B.codes" | grep -cx 1 || true)" -ge 10 ]
}
wait_until "$E2E_GUARD_S" after || fail "after the kill: A $(wc -l < "$tmp/A.codes") Z $(wc -l < "$tmp/Z.codes") B $(tail -3 "$tmp/B.lerr")"
touch "$tmp/stop"
wait "${loops[@]}"
afail=$(tail -n +"$((a0 + 1))" "$tmp/A.codes" | grep -cvx 0 || true)
zfail=$(tail -n +"$((z0 + 1))" "$tmp/Z.codes" | grep -cvx 0 || true)
say "after the kill: A $afail of $(($(wc -l < "$tmp/A.codes") - a0)) failed, Z $zfail of $(($(wc -l < "$tmp/Z.codes") - z0)), B: $(tail -1 "$tmp/B.lerr")"
[ "$zfail" = 0 ] || fail "Z (peer_failure = zeros) failed: $(tail -3 "$tmp/Z.lerr")"
[ "$afail" -le 3 ] || fail "A failed $afail times: B holds shard 1 too: $(tail -3 "$tmp/A.lerr")"
grep -q "UNAVAILABLE\|unavailable" "$tmp/B.lerr" || fail "B's failures are not UNAVAILABLE: $(tail -3 "$tmp/B.lerr")"
[ "$(count B 2)" = 0 ] || fail "B: usage errors"
zeros=$(metric "$(mport Z)" monolith_serving_peer_zero_fids_total)
[ "${zeros%.*}" -gt 0 ] || fail "Z counted no ids read as zeros"
bfail=$(metric "$(mport B)" 'monolith_serving_peer_failures_total{peer="'"$(addr C)"'"}')
uncovered=$(metric "$(mport B)" monolith_serving_remote_shards_uncovered)
[ "$uncovered" = 1 ] || fail "B: remote_shards_uncovered $uncovered"
say "Z read $zeros ids as zeros; B: peer failures $bfail, uncovered shards $uncovered"

say "== 4. C back on its address"
node C
wait_until "$E2E_GUARD_S" ready C || fail "C never became SERVING again"
wait_until "$E2E_GUARD_S" pred B || fail "B never answered again: $(cat "$tmp/B.perr")"
wait_until "$E2E_GUARD_S" all_same || fail "the nodes' scores differ: $(cat "$tmp"/[ABCZ].json)"
say "PASS"
