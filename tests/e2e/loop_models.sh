#!/usr/bin/env bash
# The loop with another model family: deploy/local-cluster.sh --quick with every daemon on the
# model MT_LOOP_MODEL names.
#  - mmoe: monolith-loadgen draws conversions (--conversions 0.3: each click converts with the
#    probability of a second hidden model) and every daemon is configured with
#    joiner.task_actions = click, conversion. Checks that the joiner labels each impression
#    once with [click, conversion]: its per-task positives equal the clicks and the
#    conversions loadgen made, every converted impression closed early (its conversion comes
#    1 s after its click, well within the 5 s window), and the actions all went through
#    Kafka; the trainer (mmoe) trained both tasks on the two-label examples, and serving
#    scored loadgen's requests with the same model.
#  - din: loadgen's users send their recent clicks (--sequence 10, slot 7) with each request;
#    serving reads them as the model's sequence (no fid ignored), its impressions carry them
#    through the joiner to the trainer (din: target attention of the candidate over them),
#    which learns from them; every Predict answered.
# Needs MT_BIN (a build tree), MT_SOURCE_DIR; MT_LOOP_MODEL (mmoe or din); MT_LOOP_MODE=smoke
# (sanitizers): a lower rate.
set -euo pipefail
: "${MT_BIN:?}" "${MT_SOURCE_DIR:?}"
model=${MT_LOOP_MODEL:-mmoe}
run=$(mktemp -d /tmp/mt-loop-models-XXXXXX)
trap 'rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
rate=200
[ "${MT_LOOP_MODE:-}" = smoke ] && rate=40

case "$model" in
  mmoe) sets="joiner.task_actions=click,conversion model.type=mmoe model.experts=2"
        lgargs="--conversions 0.3" ;;
  din) sets="trainer.slots=1,2,3,4,5,6,7 model.type=din model.sequence_slot=7 model.sequence_query=2 model.sequence_length=10"
       lgargs="--sequence 10" ;;
  *) fail "MT_LOOP_MODEL=$model: mmoe or din" ;;
esac
MT_BIN="$MT_BIN" MT_RUN_DIR="$run" MT_CLUSTER_SETS="$sets" MT_LOADGEN_ARGS="$lgargs" \
  bash "$MT_SOURCE_DIR/deploy/local-cluster.sh" --quick --rate "$rate" > "$run.out" 2>&1 \
  || { tail -40 "$run.out" >&2; rm -f "$run.out"; fail "local-cluster.sh"; }
rm -f "$run.out"
lg="$run/loadgen.json" jr="$run/joiner.json"
[ -s "$lg" ] && [ -s "$jr" ] || fail "no reports"
cat "$lg" "$jr"
grep -q "model $model" "$run/trainer.log" || fail "the trainer's model: $(grep -m3 model "$run/trainer.log")"
if [ "$model" = din ]; then
  [ "$(json "$jr" impressions)" = "$(json "$lg" impressions)" ] || fail "joiner impressions"
  [ "$(json "$jr" positives)" = "$(json "$lg" clicks)" ] || fail "joiner positives != clicks"
  [ "$(json "$run/report.json" examples)" -gt 0 ] || fail "trainer: $(cat "$run/report.json")"
  grep -q "^monolith_serving_ignored_fids_total 0$" "$run/serving.metrics" \
    || fail "serving ignored fids: $(grep ignored_fids "$run/serving.metrics")"
  [ "$(json "$lg" ok)" -gt 0 ] && [ "$(json "$lg" errors)" = 0 ] || fail "loadgen's Predicts: $(cat "$lg")"
  echo "loop with din over the users' recent clicks: all good"
  exit 0
fi
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
