#!/usr/bin/env bash
# The replayed trivago stream, joined by monolith-joiner, against labels computed directly
# from the file (issue #5):
#   1. count from the CSV itself (gzip -dc | awk, independent of replay/): click-outs,
#      shown hotels, click-outs whose clicked hotel was shown;
#      positives = those click-outs, negatives = every other shown hotel;
#   2. `monolith replay --dataset trivago --as-fast-as-possible` into monolith-kafka-dev
#      (features:8, actions:8 as by default: lz4 keeps the replay inside the mock's
#      per-partition retention; examples:32 because the joiner's ~60 MB of uncompressed
#      examples would not fit 8 partitions of ~5 MiB);
#   3. monolith-joiner (negative_rate 1, --until-caught-up: it ends once it has read both
#      topics to their ends; a second run with --drain: the stream has ended, close every
#      window) reads both topics; its report must show exactly those positives and negatives, and
#      the examples topic must hold positives + negatives messages (kcat).
# Needs MT_CLI_BIN, MT_KAFKA_BIN, MT_JOINER_BIN, MT_SHARED_DATA(_BUILD); kcat; MT_E2E_ROWS
# (optional) limits it to the first rows of the sample. Without the trivago
# sample (a clone without ../shared/data) it says so and exits 77: ctest counts it as skipped.
set -euo pipefail
: "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_JOINER_BIN:?}"
. "$(dirname "$0")/lib.sh"
command -v kcat > /dev/null || { echo "FAIL: kcat is missing (apt-get install kcat)" >&2; exit 1; }
data="$(shared_data)/trivago-recsys2019-sample/trivago_val_100k.csv.gz"
if [ ! -r "$data" ]; then
  skip_case replay_trivago_join "$data"
  exit 77 # ctest's SKIP_RETURN_CODE: counted as skipped, not passed
fi
E2E_KILL=TERM # the daemons stop cleanly at the end
e2e_init replay-join
# Under the sanitizers (MT_E2E_ROWS, set by tests/cmake/replay.cmake) the first rows of the
# sample only: the same checks on a smaller file (the whole one: 90 s under ASan, 25 s these
# rows; 35 s in release).
min_clickouts=10000
if [ -n "${MT_E2E_ROWS:-}" ]; then
  gzip -dc "$data" | head -n "$((MT_E2E_ROWS + 1))" | gzip -1 > "$tmp/sample.csv.gz" || true
  [ -s "$tmp/sample.csv.gz" ] || fail "could not cut the sample"
  data="$tmp/sample.csv.gz"
  min_clickouts=$((MT_E2E_ROWS / 100))
  echo "(sanitizers: the first $MT_E2E_ROWS rows of the sample)"
fi

echo "== 1. labels straight from the file"
# Click-out rows: fields 1-6 (user, session, timestamp, step, action_type, reference) and
# the last two (impressions, prices) are never quoted; only city is.
read -r clickouts shown positives < <(gzip -dc "$data" | awk -F, '
  NR > 1 && $5 == "clickout item" {
    c++; n = split($(NF - 1), imp, "|"); s += n; hit = 0
    for (i = 1; i <= n; i++) if (imp[i] == $6) hit = 1
    p += hit
  }
  END { print c, s, p }')
negatives=$((shown - positives))
echo "click-outs $clickouts, shown $shown, positives $positives, negatives $negatives"
[ "$clickouts" -gt "$min_clickouts" ] || fail "too few click-outs: $clickouts"

start_kafka features:8,actions:8,examples:32

echo "== 2. replay"
start=$(date +%s.%N)
"$MT_CLI_BIN" replay --dataset trivago --path "$data" --kafka "$bs" --as-fast-as-possible \
  > "$tmp/replay.json" 2> "$tmp/replay.err" || { cat "$tmp/replay.err" >&2; fail "replay"; }
echo "replayed in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }') s:"
cat "$tmp/replay.json"
sed 's/:/: /g' "$tmp/replay.json" > "$tmp/replay.sp.json"
[ "$(json "$tmp/replay.sp.json" impressions)" = "$shown" ] || fail "replay impressions"
[ "$(json "$tmp/replay.sp.json" actions)" = "$positives" ] || fail "replay actions"

echo "== 3. join"
cat > "$tmp/joiner.conf" <<EOF
[kafka]
bootstrap = $bs
session_timeout_ms = 6000

[joiner]
state_dir = $tmp/joiner-state
negative_rate = 1
sync = false
commit_interval_ms = 200

[slot.1]
dim = 8
EOF
# The joiner reads a backlog here: its 8 partitions at different paces, so its watermark
# (the largest event time seen, minus allowed_lateness_s) runs ahead of the slower
# partitions; with the default 10 s lateness their messages count as late. A day of
# lateness covers that skew (the windows of 1800 s still close as the stream advances).
# Two runs, each ending by itself once it has read every input partition to its end
# (--until-caught-up; --duration-s only a hang guard): the first reads the whole stream, the
# second resumes from the state and the committed offsets, finds nothing new and closes the
# last windows (--drain). Reports are per run.
total=$((shown + positives))
seen=0 pos=0 neg=0 late=0
join_round() { # NAME [--drain]
  local name=$1
  shift
  "$MT_JOINER_BIN" --config "$tmp/joiner.conf" --set "kafka.bootstrap=$bs" \
    --set joiner.allowed_lateness_s=86400 --set joiner.idle_advance_ms=0 \
    --until-caught-up --duration-s "$E2E_GUARD_S" "$@" --report "$tmp/join.json" \
    > "$tmp/join.out" 2> "$tmp/join.err" \
    || { tail -30 "$tmp/join.err" >&2; fail "monolith-joiner (run $name)"; }
  grep -q "caught up" "$tmp/join.err" || fail "run $name: not caught up in $E2E_GUARD_S s"
  echo "run $name: $(cat "$tmp/join.json")"
  seen=$((seen + $(json "$tmp/join.json" impressions) + $(json "$tmp/join.json" actions)))
  pos=$((pos + $(json "$tmp/join.json" positives)))
  neg=$((neg + $(json "$tmp/join.json" negatives)))
  late=$((late + $(json "$tmp/join.json" late_impressions) + $(json "$tmp/join.json" late_actions)))
}
join_round 1
[ "$seen" -eq "$total" ] || fail "the joiner read $seen messages, $total were replayed"
join_round drain --drain
[ "$seen" -eq "$total" ] || fail "the second run read $((seen - total)) messages again"
[ "$late" -eq 0 ] || echo "note: $late messages counted late by the joiner"
[ "$pos" = "$positives" ] || fail "joiner positives $pos, the file says $positives"
[ "$neg" = "$negatives" ] || fail "joiner negatives $neg, the file says $negatives"
examples=$(kcat -b "$bs" -C -t examples -e -o beginning -q -f '%o\n' | wc -l)
[ "$examples" -eq "$shown" ] || fail "examples topic holds $examples, expected $shown"
echo "replay -> joiner: $pos positives, $neg negatives, as in the file: all good"
