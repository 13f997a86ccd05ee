#!/usr/bin/env bash
# Parameter fan-out through Kafka with real processes (docs/serving.md, "Parameter fan-out
# through Kafka"): monolith-kafka-dev, 2 monolith-ps shards publishing their changes every
# 50 ms (ps.publish_ms), three monolith-serving replicas following through the topic
# (serving.sync_source = kafka, R1..R3) and one following the shards directly (D, the
# reference), a batch monolith-trainer.
#  1. every replica holds the PS's rows and gives D's scores (within 1e-5);
#  2. more training reaches every replica while the shards answer no Sync (their Sync count
#     stays flat: the fan-out costs them nothing per replica);
#  3. shard 1 checkpointed, trained further, killed with SIGKILL and restarted from its
#     checkpoint (a new incarnation, fewer rows): every replica resyncs to its rows;
#  4. a replica killed with SIGKILL mid-stream and restarted bootstraps and follows again.
# Needs MT_PS_BIN, MT_TRAINER_BIN, MT_SERVING_BIN, MT_CLI_BIN, MT_KAFKA_BIN, MT_SOURCE_DIR.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_init fanout
py=/usr/bin/python3
start_kafka params:2

conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
small=(--set trainer.hidden=32,16 --set trainer.batch_size=200 --set trainer.progress_interval_ms=0
       --set "kafka.bootstrap=$bs")
"$MT_CLI_BIN" gen --examples 4000 --seed 5 --users 300 --items 100 > "$tmp/a.tsv"
"$MT_CLI_BIN" gen --examples 4000 --seed 6 --users 600 --items 200 > "$tmp/b.tsv"
"$MT_CLI_BIN" gen --examples 4000 --seed 7 --users 900 --items 300 > "$tmp/c.tsv"
declare -A port pid
# shard I: publishing every 50 ms, shard 1 with a snapshot store
shard() {
  local i=$1
  rm -f "$tmp/ps$i.port"
  "$MT_PS_BIN" --config "$conf" "${small[@]}" --shard "$i" --num-shards 2 \
    --listen "127.0.0.1:${port[ps$i]:-0}" --port-file "$tmp/ps$i.port" \
    --set ps.expire_interval_ms=0 --set ps.publish_ms=50 --set ps.metrics_listen=127.0.0.1:0 \
    --set "ps.snapshot_dir=$tmp/snap$i" --set ps.snapshot_interval_s=0 2>> "$tmp/ps$i.err" &
  pids+=($!)
  pid[ps$i]=$!
  wait_port_file "$tmp/ps$i.port"
  port[ps$i]=$(cat "$tmp/ps$i.port")
}
shard 0
shard 1
ps="127.0.0.1:${port[ps0]},127.0.0.1:${port[ps1]}"
train() {
  "$MT_TRAINER_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" --train "$1" \
    > "$tmp/tr.out" 2>> "$tmp/tr.err" || fail "the trainer exited $? on $1"
}
train "$tmp/a.tsv"

# node NAME [--set k=v]...: a serving daemon, metrics on a port of its own
node() {
  local n=$1
  shift
  rm -f "$tmp/$n.port"
  "$MT_SERVING_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" \
    --listen "127.0.0.1:${port[$n]:-0}" --port-file "$tmp/$n.port" \
    --set serving.sync_interval_ms=200 --set serving.dense_sync_interval_ms=200 \
    --set serving.log_sample_rate=0 --set serving.metrics_listen=127.0.0.1:0 "$@" \
    2>> "$tmp/$n.err" &
  pids+=($!)
  pid[$n]=$!
  wait_port_file "$tmp/$n.port"
  port[$n]=$(cat "$tmp/$n.port")
}
replicas=(R1 R2 R3)
for n in "${replicas[@]}"; do node "$n" --set serving.sync_source=kafka; done
node D
ready() { "$MT_CLI_BIN" health --addr "127.0.0.1:${port[$1]}" > /dev/null 2>&1; }
for n in D "${replicas[@]}"; do wait_until "$E2E_GUARD_S" ready "$n" || fail "$n never became SERVING"; done
mport() { sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$tmp/$1.err" | tail -1; }
say "PS $ps, Kafka $bs; replicas R1..R3 through the topic, D directly"

req=(predict --user 1:17,3:2,5:9 --candidate 5=2:5,4:3,6:1 --candidate 6=2:6,4:1
     --candidate 77=2:77,4:2,6:2,6:3 --candidate 8=2:8,4:4,6:5)
pred() { "$MT_CLI_BIN" "${req[@]}" --addr "127.0.0.1:${port[$1]}" > "$tmp/$1.json" 2> "$tmp/$1.perr"; }
ps_rows() {
  "$MT_CLI_BIN" stats --addr "127.0.0.1:${port[ps$1]}" 2> /dev/null | sed -n 's/.*"rows":\([0-9]*\).*/\1/p'
}
# every replica holds the PS's rows and scores as D does
converged() {
  local want n
  want=$(($(ps_rows 0) + $(ps_rows 1))) || return 1
  for n in D "${replicas[@]}"; do
    [ "$(metric "$(mport "$n")" monolith_serving_rows)" = "$want" ] || return 1
    pred "$n" || return 1
  done
  "$py" - "$tmp/D.json" "$tmp/R1.json" "$tmp/R2.json" "$tmp/R3.json" <<'PY' 2> /dev/null
import json, sys
s = [json.load(open(f))["scores"] for f in sys.argv[1:]]
assert all(len(x) == 4 for x in s), s
assert all(abs(a - b) <= 1e-5 for x in s[1:] for a, b in zip(s[0], x)), s
PY
}
state() {
  local n
  echo "PS rows $(ps_rows 0) + $(ps_rows 1);"
  for n in D "${replicas[@]}"; do echo "$n $(metric "$(mport "$n")" monolith_serving_rows) $(cat "$tmp/$n.json" 2> /dev/null);"; done
}
syncs() { metric "$(mport "ps$1")" "monolith_ps_request_seconds_count{shard=\"$1\",method=\"Sync\"}"; }
for i in 0 1; do
  wait_until "$E2E_GUARD_S" grep -q "metrics on port" "$tmp/ps$i.err" || fail "shard $i: no metrics port"
done

say "== 1. every replica holds the PS's rows and gives D's scores"
wait_until "$E2E_GUARD_S" converged || fail "not converged: $(state)"
say "converged: $(state)"

say "== 2. more training reaches them; the shards answer no Sync but D's"
# D follows directly: its stream may be reopened (counted); the replicas' share must not grow
s0=$(syncs 0) s1=$(syncs 1)
train "$tmp/b.tsv"
wait_until "$E2E_GUARD_S" converged || fail "not converged: $(state)"
d0=$(( ${s0%.*} )) e0=$(( $(syncs 0 | cut -d. -f1) ))
d1=$(( ${s1%.*} )) e1=$(( $(syncs 1 | cut -d. -f1) ))
[ $((e0 - d0)) -le 1 ] && [ $((e1 - d1)) -le 1 ] ||
  fail "Sync calls grew: shard 0 $d0 -> $e0, shard 1 $d1 -> $e1"
pub0=$(metric "$(mport ps0)" 'monolith_ps_publish_entries_total{shard="0"}')
say "converged: $(state) Sync calls shard 0 $d0 -> $e0, shard 1 $d1 -> $e1; shard 0 published $pub0 entries"

say "== 3. shard 1 checkpointed, trained further, killed (SIGKILL) and restored"
"$MT_CLI_BIN" snapshot --addr "127.0.0.1:${port[ps1]}" > /dev/null || fail "snapshot of shard 1"
rows_ckpt=$(ps_rows 1)
train "$tmp/c.tsv"
wait_until "$E2E_GUARD_S" converged || fail "not converged: $(state)"
rows_more=$(ps_rows 1)
[ "$rows_more" -gt "$rows_ckpt" ] || fail "shard 1 rows $rows_ckpt -> $rows_more"
resyncs() { metric "$(mport "$1")" 'monolith_serving_sync_resyncs_total{shard="1"}'; }
r0=$(resyncs R1)
kill -9 "${pid[ps1]}"
wait "${pid[ps1]}" 2> /dev/null || true
shard 1
[ "$(ps_rows 1)" = "$rows_ckpt" ] || fail "restored shard 1 has $(ps_rows 1) rows, the checkpoint $rows_ckpt"
wait_until "$E2E_GUARD_S" converged || fail "not converged after the restore: $(state)"
[ "$(resyncs R1)" != "$r0" ] || fail "R1 did not resync"
say "converged after the restore: $(state) (shard 1: $rows_more rows before the kill, $rows_ckpt restored)"

say "== 4. a replica killed (SIGKILL) mid-stream and restarted"
kill -9 "${pid[R2]}"
wait "${pid[R2]}" 2> /dev/null || true
train "$tmp/a.tsv"
node R2 --set serving.sync_source=kafka
wait_until "$E2E_GUARD_S" ready R2 || fail "R2 never became SERVING again"
wait_until "$E2E_GUARD_S" converged || fail "not converged: $(state)"
say "converged: $(state)"
say "PASS"
