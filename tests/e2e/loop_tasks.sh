#!/usr/bin/env bash
# The loop with two tasks: deploy/local-cluster.sh --quick with monolith-loadgen drawing
# conversions (--conversions 0.3: each click converts with the probability of a second
# hidden model) and every daemon configured with joiner.task_actions = click, conversion.
# Checks that the joiner labels each impression once with [click, conversion]: its per-task
# positives equal the clicks and the conversions loadgen made, every converted impression
# closed early (its conversion comes 1 s after its click, well within the 5 s window), and
# the actions all went through Kafka; the trainer (mmoe: model.type) trained both tasks on the
# two-label examples, and serving scored loadgen's requests with the same model.
# Needs MT_BIN (a build tree), MT_SOURCE_DIR; MT_LOOP_MODE=smoke (sanitizers): a lower rate.
set -euo pipefail
: "${MT_BIN:?}" "${MT_SOURCE_DIR:?}"
run=$(mktemp -d /tmp/mt-loop-tasks-XXXXXX)
trap 'rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
rate=200
[ "${MT_LOOP_MODE:-}" = smoke ] && rate=40

MT_BIN="$MT_BIN" MT_RUN_DIR="$run" MT_CLUSTER_SETS="joiner.task_actions=click,conversion model.type=mmoe model.experts=2" \
  MT_LOADGEN_ARGS="--conversions 0.3" bash "$MT_SOURCE_DIR/deploy/local-cluster.sh" --quick \
  --rate "$rate" > "$run.out" 2>&1 || { tail -40 "$run.out" >&2; rm -f "$run.out"; fail "local-cluster.sh"; }
rm -f "$run.out"
lg="$run/loadgen.json" jr="$run/joiner.json"
[ -s "$lg" ] && [ -s "$jr" ] || fail "no reports"
cat "$lg" "$jr"
clicks=$(json "$lg" clicks) conv=$(json "$lg" conversions)
[ "${conv:-0}" -gt 0 ] && [ "$conv" -lt "$clicks" ] || fail "conversions: $conv of $clicks clicks"
[ "$(json "$lg" clicks_delivered)" = $((clicks + conv)) ] || fail "actions not all delivered"
[ "$(json "$jr" impressions)" = "$(json "$lg" impressions)" ] || fail "joiner impressions"
[ "$(json "$jr" click)" = "$clicks" ] || fail "click positives != $clicks clicks"
[ "$(json "$jr" conversion)" = "$conv" ] || fail "conversion positives != $conv conversions"
[ "$(json "$jr" positives)" = "$clicks" ] || fail "positives != clicks"
[ "$(json "$jr" closed_early)" = "$conv" ] || fail "closed early != $conv conversions"
[ "$(json "$jr" no_task_actions)" = 0 ] && [ "$(json "$jr" late_actions)" = 0 ] || fail "joiner"
[ "$(json "$jr" pending)" = 0 ] || fail "pending impressions left"
[ "$(json "$run/report.json" examples)" -gt 0 ] || fail "trainer: $(cat "$run/report.json")"
# the trainer and serving ran the two-task model: an AUC per task, a score per task served
[ "$(json "$run/report.json" tasks)" = 2 ] || fail "trainer tasks: $(cat "$run/report.json")"
grep -q '"task_progressive_auc": \[' "$run/report.json" || fail "no per-task AUC: $(cat "$run/report.json")"
[ "$(json "$lg" ok)" -gt 0 ] && [ "$(json "$lg" errors)" = 0 ] || fail "loadgen's Predicts: $(cat "$lg")"
echo "loop with tasks click, conversion: all good"
