#!/usr/bin/env bash
# The loop's report shows AUC higher with fresher sync (issue #6; the Monolith paper's
# Table 2 direction). Runs deploy/local-cluster.sh --compare shortened: 30 s of training,
# then a replica synced every 1 s and one never synced after its first sync, 60 s of pages
# scored by both (the same pages, the same clicks: paired). Checks that
#   - the loop ran: every page answered, clicks delivered to Kafka, the joiner labelled
#     every impression, the trainer trained;
#   - (MT_LOOP_MODE=auc) the 1 s replica's mean AUC over the paired windows beats the
#     unsynced one's by at least 0.01 (seen: 0.05 to 0.07; the generator's items are born
#     and fade within a minute and its item vectors drift, so a frozen model falls behind),
#     and the plot was drawn when gnuplot is installed.
# Needs MT_BIN (a build tree), MT_SOURCE_DIR.
set -euo pipefail
: "${MT_BIN:?}" "${MT_SOURCE_DIR:?}"
mode=${MT_LOOP_MODE:-auc}
run=$(mktemp -d /tmp/mt-loop-XXXXXX)
trap 'rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
rate=200 warmup=30 seconds=60
# under the sanitizers the loop only has to run: a shorter one (no AUC is judged)
[ "$mode" = smoke ] && { rate=40 warmup=10 seconds=20; }

MT_BIN="$MT_BIN" MT_RUN_DIR="$run" bash "$MT_SOURCE_DIR/deploy/local-cluster.sh" --compare \
  --warmup "$warmup" --seconds "$seconds" --intervals "1000 none" --rate "$rate" > "$run.out" 2>&1 \
  || { tail -40 "$run.out" >&2; rm -f "$run.out"; fail "local-cluster.sh --compare"; }
cat "$run.out"
rm -f "$run.out"
lg="$run/loadgen.json"
[ -s "$lg" ] || fail "no loadgen report"
req=$(json "$lg" requests)
[ "${req:-0}" -gt $((rate * seconds)) ] || fail "too few requests: $(cat "$lg")"
grep -q '"errors": 0' "$lg" || fail "serving errors: $(cat "$lg")"
clicks=$(json "$lg" clicks)
[ "$(json "$lg" clicks_delivered)" = "$clicks" ] || fail "clicks not all delivered: $(cat "$lg")"
[ "$(json "$run/joiner.json" impressions)" = "$(json "$lg" impressions)" ] ||
  fail "joiner impressions: $(cat "$run/joiner.json") vs $(cat "$lg")"
[ "$(json "$run/joiner.json" positives)" = "$clicks" ] || fail "joiner positives: $(cat "$run/joiner.json")"

# Prometheus (Debian's, started by the cluster on loopback) scraped every daemon: its HTTP
# API answered the cluster's queries with each daemon kind up and a metric of each
pj="$run/prometheus.json"
[ -s "$pj" ] || fail "no Prometheus answers (is prometheus installed? bash scripts/setup.sh)"
/usr/bin/python3 - "$pj" <<'PY' || fail "Prometheus: $(cat "$pj")"
import json, sys
ans = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    ans[r["query"]] = (r.get("answer") or {}).get("data", {}).get("result", [])
up = {(m["metric"].get("daemon"), m["metric"].get("shard")): m["value"][1]
      for m in ans['up{job="monolith"}']}
for d in ("ps", "serving", "trainer", "joiner"):
    assert any(k[0] == d and v == "1" for k, v in up.items()), (d, up)
for q in ("monolith_ps_rows", "monolith_serving_rows", "monolith_trainer_examples_total",
          "monolith_joiner_messages_total", "process_resident_memory_bytes"):
    assert ans.get(q), q
print("prometheus: every daemon up and scraped")
PY

paired() { sed -n "s/.*\"$1\": {[^}]*\"paired_auc\": \([-0-9.enul]*\).*/\1/p" "$lg"; }
a1=$(paired sync_1s) an=$(paired sync_none) windows=$(json "$lg" paired_windows)
echo "paired windows $windows: sync 1 s AUC $a1, no sync AUC $an"
[ "$mode" = smoke ] && { echo "loop (smoke, sanitizers): all good"; exit 0; }
[ "${windows:-0}" -ge 3 ] || fail "only ${windows:-0} paired windows"
awk -v a="$a1" -v b="$an" 'BEGIN { exit !(a > b + 0.01) }' ||
  fail "fresher sync did not win: 1 s $a1, none $an"
if command -v gnuplot > /dev/null; then
  [ -s "$run/sync-compare.png" ] || fail "no plot"
fi
echo "loop: AUC higher with fresher sync ($a1 > $an): all good"
