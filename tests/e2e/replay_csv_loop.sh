#!/usr/bin/env bash
# Your own click log through the loop, end to end on monolith-kafka-dev:
#   1. a TSV ad log written here (3,000 rows out of time order, requests of 3 ads, about
#      one click in six, 3 bad rows) and a config whose only description of the data is
#      [input] (no trainer.slots, no [slot.N]): the trainer derives its 3 slots from it and
#      trains on the file in batch mode as it is; wrong or missing column settings make
#      `monolith replay` exit 2 naming the key;
#   2. `monolith replay --dataset csv` produces exactly the good rows as impressions and the
#      clicks among them as actions, and counts the 3 bad rows;
#   3. monolith-joiner (negative_rate 1, --drain at the end) joins them: its positives and
#      negatives are those counted from the file by awk, and `examples` holds exactly one
#      example per good row;
#   4. monolith-trainer --online against a monolith-ps shard (both configured by the same
#      file) trains on exactly those examples, and the shard holds a row for every feature id
#      of the file and its first-order weight.
# Every wait is a condition (wait_until, the daemons' own exits) with a hang guard; nothing
# depends on how fast the machine is.
# Needs MT_CLI_BIN, MT_KAFKA_BIN, MT_JOINER_BIN, MT_TRAINER_BIN, MT_PS_BIN; kcat.
set -euo pipefail
: "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_JOINER_BIN:?}" "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}"
. "$(dirname "$0")/lib.sh"
need_kcat
E2E_KILL=TERM # the daemons stop cleanly at the end
e2e_init replay-csv

say "== 1. a log and its config"
# Row i (line i + 2): its time a permutation of 3,000 seconds (7919 is prime to 3000; printed
# as text: mawk prints large numbers as 1.7e+12), request
# req-<i/3> showing three different ads, a user of 97, a site of 5; clicks on i % 7 == 0 or
# i % 11 == 3. Then 3 bad rows: a timestamp that is no number, 3 columns, an ad that is no
# integer.
awk -v n=3000 'BEGIN {
  OFS = "\t"
  print "ts", "rid", "user", "ad", "site", "click"
  for (i = 0; i < n; i++)
    print sprintf("170000%04d000", (i * 7919) % n), "req-" int(i / 3), "u" (i % 97),
          1000 + (i * 13) % 211, "s" (i % 5), (i % 7 == 0 || i % 11 == 3) ? 1 : 0
  print "yesterday", "req-x1", "u1", 1001, "s1", 1
  print "1700000000000", "req-x2", "u1"
  print "1700000000000", "req-x3", "u1", "ad?", "s1", 0
}' > "$tmp/log.tsv"
# what the file says, counted here independently of replay/: good rows, clicks, distinct ids
read -r good pos users ads sites < <(awk -F'\t' '
  NR > 1 && NF == 6 && $1 ~ /^[0-9]+$/ && $4 ~ /^[0-9]+$/ {
    g++; p += $6 == 1; if (!u[$3]++) nu++; if (!a[$4]++) na++; if (!s[$5]++) ns++
  }
  END { print g, p, nu, na, ns }' "$tmp/log.tsv")
neg=$((good - pos))
say "good rows $good (clicks $pos, no click $neg); ids: $users users, $ads ads, $sites sites"
[ "$good" -eq 3000 ] && [ "$pos" -gt 300 ] || fail "the generated log is not what this test means"

cat > "$tmp/my.conf" <<EOF
[input]
format = tsv
columns = user:1:string, ad:2, site:3:string
label = click
timestamp = ts
time_unit = ms
request_id = rid
item_id = ad

[trainer]
dim = 8
hidden = 16
batch_size = 100
dense_sync_batches = 1
commit_interval_ms = 200
auc_window = 1000

[kafka]
session_timeout_ms = 6000

[joiner]
negative_rate = 1
allowed_lateness_s = 86400
idle_advance_ms = 0
commit_interval_ms = 200
progress_interval_ms = 200
state_dir = $tmp/joiner-state
sync = false

[ps]
snapshot_dir =
EOF
# [input] alone gives the model its slots (1, 2, 3: rows of embedding and first-order weight)
"$MT_TRAINER_BIN" --config "$tmp/my.conf" --check > "$tmp/check.out" 2> "$tmp/check.err" ||
  fail "trainer --check: $(cat "$tmp/check.err")"
grep -q "ok (3 feature slots, 3 table slots)" "$tmp/check.out" || fail "check: $(cat "$tmp/check.out")"
# the same file trains in batch mode as it is: 3,000 examples, the 3 bad lines skipped
"$MT_TRAINER_BIN" --config "$tmp/my.conf" --train "$tmp/log.tsv" --report "$tmp/batch.json" \
  > /dev/null 2> "$tmp/batch.err" || fail "batch training on the log"
[ "$(json "$tmp/batch.json" examples)" = "$good" ] || fail "batch: $(cat "$tmp/batch.json")"
[ "$(json "$tmp/batch.json" bad_lines)" = 3 ] || fail "batch: $(cat "$tmp/batch.json")"

# a column setting that is wrong or missing: exit 2, the message names it
expect2() { # expect2 PATTERN ARGS...
  local pat=$1 got
  shift
  set +e
  "$MT_CLI_BIN" replay --dataset csv --path "$tmp/log.tsv" "$@" > /dev/null 2> "$tmp/bad.err"
  got=$?
  set -e
  [ "$got" = 2 ] || fail "replay $* exited $got, expected 2: $(cat "$tmp/bad.err")"
  grep -q -- "$pat" "$tmp/bad.err" || fail "replay $*: no '$pat' in: $(cat "$tmp/bad.err")"
}
expect2 "label: column 'clik' is not in the header" --config "$tmp/my.conf" --set input.label=clik
expect2 "input.timestamp" --config "$tmp/my.conf" --set input.timestamp=
expect2 "input.columns: 'user': expected column:slot" --config "$tmp/my.conf" --set input.columns=user
expect2 "needs --config" --progress-s 0
expect2 "input.bogus" --config "$tmp/my.conf" --set input.bogus=1

say "== 2. replay into Kafka"
start_kafka features:4,actions:4,examples:4
"$MT_CLI_BIN" replay --dataset csv --config "$tmp/my.conf" --path "$tmp/log.tsv" --kafka "$bs" \
  --progress-s 0 > "$tmp/replay.json" 2> "$tmp/replay.err" || fail "replay"
cat "$tmp/replay.json"
sed 's/:/: /g' "$tmp/replay.json" > "$tmp/replay.sp.json"
[ "$(json "$tmp/replay.sp.json" impressions)" = "$good" ] || fail "replay impressions"
[ "$(json "$tmp/replay.sp.json" actions)" = "$pos" ] || fail "replay actions"
[ "$(json "$tmp/replay.sp.json" bad_rows)" = 3 ] || fail "replay bad rows"
[ "$(json "$tmp/replay.sp.json" delivered)" = $((good + pos)) ] || fail "replay deliveries"
for line in 3002 3003 3004; do
  grep -q "line $line: .*(skipped)" "$tmp/replay.err" || fail "bad row on line $line not reported"
done

say "== 3. join"
total=$((good + pos))
"$MT_JOINER_BIN" --config "$tmp/my.conf" --set "kafka.bootstrap=$bs" --drain \
  --report "$tmp/join.json" > "$tmp/join.out" 2> "$tmp/join.err" &
jpid=$!
pids+=($jpid)
joined() { sed -n 's/^joiner  \([0-9]*\) msg.*/\1/p' "$tmp/join.err" | tail -1; }
all_read() { n=$(joined); [ "${n:-0}" -ge "$total" ]; }
wait_until "$E2E_GUARD_S" all_read || fail "the joiner read ${n:-0} of $total messages"
kill -TERM "$jpid" # --drain: at exit every window closes (the end of a replayed stream)
wait "$jpid" || fail "joiner exit status $?"
cat "$tmp/join.json"
[ "$(json "$tmp/join.json" impressions)" = "$good" ] || fail "joiner impressions"
[ "$(json "$tmp/join.json" actions)" = "$pos" ] || fail "joiner actions"
[ "$(json "$tmp/join.json" positives)" = "$pos" ] || fail "joiner positives, the file says $pos"
[ "$(json "$tmp/join.json" negatives)" = "$neg" ] || fail "joiner negatives, the file says $neg"
[ "$(json "$tmp/join.json" duplicates)" = 0 ] || fail "joiner duplicates"
[ "$(json "$tmp/join.json" bad_messages)" = 0 ] || fail "joiner bad messages"
expect_in_topic "$good"

say "== 4. the online trainer on a PS shard"
"$MT_PS_BIN" --config "$tmp/my.conf" --listen 127.0.0.1:0 --port-file "$tmp/ps.port" \
  2> "$tmp/ps.err" &
pids+=($!)
wait_port_file "$tmp/ps.port"
port=$(cat "$tmp/ps.port")
"$MT_TRAINER_BIN" --config "$tmp/my.conf" --set "kafka.bootstrap=$bs" --set kafka.group=t1 \
  --set "cluster.ps=127.0.0.1:$port" --online --max-examples "$good" --report "$tmp/train.json" \
  > "$tmp/train.out" 2> "$tmp/train.err" || fail "trainer"
cat "$tmp/train.json"
[ "$(json "$tmp/train.json" examples)" = "$good" ] || fail "trainer examples"
[ "$(json "$tmp/train.json" bad_messages)" = 0 ] || fail "trainer bad messages"
# every id of the file has its row (embedding and first-order weight) on the shard
want_rows=$((users + ads + sites))
rows=$("$MT_CLI_BIN" stats --addr "127.0.0.1:$port" |
  sed -n 's/.*"rows": *\([0-9]*\).*/\1/p' | head -1)
[ "${rows:-0}" = "$want_rows" ] || fail "PS rows ${rows:-?}, expected $want_rows"
sanitizer_reports
say "your log -> replay -> joiner -> trainer -> PS: $good examples, $pos positives, $rows rows: ok"
