#!/usr/bin/env bash
# The loop on one machine (the README's main job):
#
#   monolith-loadgen ──Predict──▶ monolith-serving ──Impressions──▶ features ─┐
#        │  (pages drawn from the synthetic ground truth;                     ├─▶ monolith-joiner
#        └── clicks drawn from the true probabilities ──▶ actions ───────────┘        │
#   monolith-serving ◀──sync── N monolith-ps shards ◀── monolith-trainer --online ◀── examples
#
# all through monolith-kafka-dev (the embedded broker), for a fixed time, then a report:
# serving AUC over time (against the clicks, with the ground truth's AUC beside it), QPS,
# latency, the joiner's and trainer's figures, sync lag, each shard's rows.
#
#   deploy/local-cluster.sh [--quick] [--shards N] [--seconds S] [--rate REQ_PER_S]
#                           [--candidates K] [--sync-ms MS] [--sharded-serving] [--kafka-sync]
#   deploy/local-cluster.sh --compare [--warmup S] [--seconds S] [--intervals "1000 10000 60000 none"]
#   deploy/local-cluster.sh --replay [--quick] [--seconds S] [--rate IMPRESSIONS_PER_S]
#
# --compare: after --warmup seconds of the loop, starts one more serving replica per sync
#   interval (logging off: they only score), all with a fresh full sync of the same PS; the
#   load generator sends every page to all of them, so they are judged on the same pages
#   and the same clicks (paired). "none" never syncs after its first sync. Ends with the
#   AUC per replica over time (build/run/sync-compare.tsv) drawn with gnuplot into
#   build/run/sync-compare.png, and each replica's mean AUC over the paired windows.
# --sharded-serving: one serving node per PS shard, each holding its shard only and reading
#   the others' rows from its peers (docs/serving.md, "Sharded serving"); the load goes to
#   the node of shard 0 (named serving, the one logging impressions), so every request
#   reads from a peer.
# --kafka-sync: the shards publish their changes to the params topic every 100 ms and the
#   serving nodes follow it instead of a Sync stream each (docs/serving.md, "Parameter
#   fan-out through Kafka"); combines with --sharded-serving.
# --replay: the stream of issue #5 instead (monolith replay --dataset gen: impressions and
#   clicks straight into Kafka, no serving).
#
# Binaries from $MT_BIN (default build/release; scripts/run-local.sh builds them first).
# Everything runs on 127.0.0.1 with OS-chosen ports; logs and reports land in $MT_RUN_DIR
# (default build/run/), with $MT_RUN_DIR/pids listing "name pid" of every process started.
# Hooks for scripts that run the loop their own way (bench/soak.sh):
#   MT_CLUSTER_SETS="section.key=value ..."  --set overrides given to every daemon (PS,
#                                            joiner, trainer, serving: they share one config)
#   MT_LOADGEN_ARGS="--flag value ..."       monolith-loadgen flags after ours (they win)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${MT_BIN:-build/release}
run=${MT_RUN_DIR:-build/run}
shards=2 seconds=60 rate=200 k=10 sync_ms=1000 mode=loop warmup=60 quick=0 sharded=0 ksync=0
intervals="1000 10000 60000 none"
rate_set=0
usage() {
  sed -n '14,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --shards) shards=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --rate) rate=$2; rate_set=1; shift ;;
    --candidates) k=$2; shift ;;
    --sync-ms) sync_ms=$2; shift ;;
    --compare) mode=compare ;;
    --warmup) warmup=$2; shift ;;
    --intervals) intervals=$2; shift ;;
    --replay) mode=replay ;;
    --sharded-serving) sharded=1 ;;
    --kafka-sync) ksync=1 ;;
    *) usage ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then
  seconds=20
  [ "$mode" = compare ] && { warmup=20 seconds=40; }
fi
if [ "$mode" = replay ] && [ "$rate_set" = 0 ]; then rate=$([ "$quick" = 1 ] && echo 4000 || echo 8000); fi
rm -rf "$run"
mkdir -p "$run"
runabs=$(cd "$run" && pwd)
pids=()
# track NAME: remember the process just started in the background ($!).
track() {
  pids+=($!)
  echo "$1 $!" >> "$run/pids"
}
extra_sets=()
# the parameters through Kafka: each daemon reads only its own section of these
[ "$ksync" = 1 ] && extra_sets+=(--set ps.publish_ms=100 --set serving.sync_source=kafka
                                 --set kafka.fetch_wait_ms=20)
for kv in ${MT_CLUSTER_SETS:-}; do extra_sets+=(--set "$kv"); done
read -r -a loadgen_extra <<< "${MT_LOADGEN_ARGS:-}"
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
wait_file() { for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
# The Prometheus port a daemon announced in its log ("metrics on port N").
metrics_port() { sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$1" | head -1; }
scrape() { # scrape PORT: the /metrics text
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  cat <&3; exec 3<&-
}

# ---- Prometheus (Debian's prometheus): every daemon scraped on loopback, with the alert
# rules of deploy/prometheus; its address in $run/prometheus.addr, its answers to one query
# per daemon kind in $run/prometheus.json (the report prints them).
prom_dir="$run/prometheus"
free_port() { # a port the kernel has free now (prometheus takes no port 0)
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}
# prom_targets: one file_sd list per daemon kind, from the ports their logs announced
prom_targets() {
  local i mp first
  mkdir -p "$prom_dir/targets"
  first=1
  { printf '['
    for i in $(seq 0 $((shards - 1))); do
      mp=$(metrics_port "$run/ps$i.log")
      [ -n "$mp" ] || continue
      [ $first = 1 ] || printf ','
      first=0
      printf '{"targets":["127.0.0.1:%s"],"labels":{"daemon":"ps","shard":"%s"}}' "$mp" "$i"
    done
    printf ']\n'; } > "$prom_dir/targets/ps.json.tmp"
  mv "$prom_dir/targets/ps.json.tmp" "$prom_dir/targets/ps.json"
  for name in serving trainer joiner $(serving_nodes); do
    mp=$(metrics_port "$run/$name.log")
    [ -n "$mp" ] || continue
    printf '[{"targets":["127.0.0.1:%s"],"labels":{"daemon":"%s","node":"%s"}}]\n' "$mp" \
      "${name%%_s[0-9]*}" "$name" \
      > "$prom_dir/targets/$name.json.tmp"
    mv "$prom_dir/targets/$name.json.tmp" "$prom_dir/targets/$name.json"
  done
}
start_prometheus() {
  if ! command -v prometheus > /dev/null; then
    echo "== prometheus: not installed (bash scripts/setup.sh installs Debian's prometheus): not started"
    return 0
  fi
  for name in trainer joiner serving $(serving_nodes); do # their metrics ports are logged by now
    for _ in $(seq 300); do [ -n "$(metrics_port "$run/$name.log")" ] && break; sleep 0.1; done
  done
  mkdir -p "$prom_dir"
  cp deploy/prometheus/prometheus.yml deploy/prometheus/alerts.yml "$prom_dir/"
  prom_targets
  local port
  port=$(free_port) || { echo "== prometheus: no free port"; return 0; }
  prometheus --config.file="$prom_dir/prometheus.yml" --web.listen-address="127.0.0.1:$port" \
    --storage.tsdb.path="$runabs/prometheus/data" --storage.tsdb.retention.time=1d \
    --log.level=warn > /dev/null 2> "$run/prometheus.log" &
  track prometheus
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/-/ready" > /dev/null 2>&1 && break
    sleep 0.1
  done
  echo "127.0.0.1:$port" > "$run/prometheus.addr"
  echo "== prometheus: http://127.0.0.1:$port (every daemon every 5 s; rules: deploy/prometheus/alerts.yml)"
}
# prom_report: one query per daemon kind through Prometheus' HTTP API, as JSON lines
prom_report() {
  [ -s "$run/prometheus.addr" ] || return 0
  local addr q
  addr=$(cat "$run/prometheus.addr")
  : > "$run/prometheus.json"
  for q in 'up{job="monolith"}' monolith_ps_rows monolith_serving_rows \
           monolith_trainer_examples_total monolith_joiner_messages_total \
           process_resident_memory_bytes 'ALERTS{alertstate="firing"}'; do
    printf '{"query":"%s","answer":%s}\n' "${q//\"/\\\"}" \
      "$(curl -sf --get --data-urlencode "query=$q" "http://$addr/api/v1/query" || echo null)" \
      >> "$run/prometheus.json"
  done
  echo "prometheus: http://$addr (queries in $run/prometheus.json):"
  /usr/bin/python3 - "$run/prometheus.json" <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    res = ((r.get("answer") or {}).get("data") or {}).get("result") or []
    vals = ", ".join("%s%s=%s" % (m["metric"].get("daemon", "?"),
                                  ("/" + m["metric"]["shard"]) if "shard" in m["metric"] else "",
                                  m["value"][1]) for m in res)
    print("   %-40s %s" % (r["query"], vals or "(none)"))
PY
}

conf=deploy/trainer.example.conf
# The loop's event time is the wall clock: short windows so that negatives come soon.
joiner_sets=(--set joiner.window_s=5 --set joiner.allowed_lateness_s=2 --set joiner.idle_advance_ms=2000)
[ "$mode" = replay ] && joiner_sets=(--set joiner.window_s=10)
total=$seconds
[ "$mode" = compare ] && total=$((warmup + seconds))

echo "== broker: monolith-kafka-dev (8 partitions per topic, params: one per shard)"
"$bin/kafka/monolith-kafka-dev" --topics "examples:8,features:8,actions:8,params:$shards" \
  --bootstrap-file "$run/bootstrap" > /dev/null 2> "$run/kafka.log" &
track kafka
wait_file "$run/bootstrap" || { cat "$run/kafka.log"; exit 1; }
bootstrap=$(cat "$run/bootstrap")
echo "   $bootstrap"

echo "== $shards PS shards: monolith-ps"
addrs=""
for i in $(seq 0 $((shards - 1))); do
  "$bin/ps/monolith-ps" --config "$conf" --shard "$i" --num-shards "$shards" \
    --listen 127.0.0.1:0 --port-file "$run/ps$i.port" --set ps.metrics_listen=127.0.0.1:0 \
    --set "ps.snapshot_dir=$runabs/snap$i" --set "kafka.bootstrap=$bootstrap" \
    "${extra_sets[@]}" 2> "$run/ps$i.log" &
  track "ps$i"
  wait_file "$run/ps$i.port" || { cat "$run/ps$i.log"; exit 1; }
  addrs="$addrs${addrs:+,}127.0.0.1:$(cat "$run/ps$i.port")"
done
echo "   $addrs"

echo "== joiner: monolith-joiner (window ${joiner_sets[1]#*=} s of event time)"
"$bin/joiner/monolith-joiner" --config "$conf" --set "kafka.bootstrap=$bootstrap" \
  "${joiner_sets[@]}" --set "joiner.state_dir=$runabs/joiner" \
  --set joiner.progress_interval_ms=0 --set joiner.metrics_listen=127.0.0.1:0 \
  --duration-s $((total + 12)) --drain \
  --report "$run/joiner.json" "${extra_sets[@]}" > "$run/joiner.out" 2> "$run/joiner.log" &
joiner=$!
track joiner

echo "== trainer: monolith-trainer --online (progress every 5 s)"
"$bin/trainer/monolith-trainer" --config "$conf" --online --duration-s $((total + 18)) \
  --set "kafka.bootstrap=$bootstrap" --set "cluster.ps=$addrs" \
  --set trainer.batch_size=512 --set kafka.session_timeout_ms=6000 \
  --set trainer.progress_interval_ms=5000 --set trainer.metrics_listen=127.0.0.1:0 \
  "${extra_sets[@]}" --report "$run/report.json" 2> >(tee "$run/trainer.log" | grep --line-buffered -E "online|error|ERROR" >&2) &
trainer=$!
track trainer

if [ "$mode" = replay ]; then
  echo "== stream: monolith replay --dataset gen, $rate impressions/s for ${seconds}s"
  "$bin/cli/monolith" replay --dataset gen --kafka "$bootstrap" --limit $((rate * seconds)) \
    --seed 1 --users 200000 --items 50000 --events-per-s 1000 \
    --speed "$(awk -v r="$rate" 'BEGIN { print r / 1000 }')" --progress-s 0 \
    > "$run/replay.json" 2> "$run/replay.log" || { cat "$run/replay.log"; exit 1; }
  wait "$joiner" || { echo "joiner failed: see $run/joiner.log"; exit 1; }
  wait "$trainer" || { echo "trainer failed: see $run/trainer.log"; exit 1; }
  echo "== report"
  printf 'replay:  '; cat "$run/replay.json"
  printf 'joiner:  '; cat "$run/joiner.json"
  printf 'trainer: '; cat "$run/report.json"
  for i in $(seq 0 $((shards - 1))); do
    printf 'shard %d: ' "$i"
    "$bin/cli/monolith" stats --addr "127.0.0.1:$(cat "$run/ps$i.port")" | head -c 300; echo
  done
  exit 0
fi

# name_of MS|none: a replica's name suffix (1000 -> 1s, 500 -> 500ms, none -> none).
name_of() {
  if [ "$1" = none ]; then echo none
  elif [ "$1" -lt 1000 ] || [ $(($1 % 1000)) -ne 0 ]; then echo "${1}ms"
  else echo "$(($1 / 1000))s"; fi
}

# serving NAME SYNC_MS LOG_RATE [STREAM_MS [LISTEN [SETS...]]]: one replica (port in
# $run/NAME.port, log in $run/NAME.log). STREAM_MS > 0 follows the shards' change streams
# (rounds every STREAM_MS); 0 (the compared replicas) polls every SYNC_MS.
serving() {
  local name=$1 ms=$2 lograte=$3 stream=${4:-0} listen=${5:-127.0.0.1:0} dense
  shift 5 2>/dev/null || shift $#
  [ "$ms" = none ] && ms=3600000 # never again within a run (the longest interval allowed)
  dense=$ms
  "$bin/serving/monolith-serving" --config "$conf" --set "cluster.ps=$addrs" \
    --set "kafka.bootstrap=$bootstrap" --listen "$listen" --port-file "$run/$name.port" "$@" \
    --set "serving.sync_interval_ms=$ms" --set "serving.dense_sync_interval_ms=$dense" \
    --set "serving.sync_stream_ms=$stream" \
    --set "serving.log_sample_rate=$lograte" --set serving.metrics_listen=127.0.0.1:0 \
    "${extra_sets[@]}" 2> "$run/$name.log" &
  track "$name"
}

# the sharded nodes besides "serving" (the node of shard 0): serving_s1 .. serving_sN-1
serving_nodes() {
  [ "$sharded" = 1 ] || return 0
  for i in $(seq 1 $((shards - 1))); do echo "serving_s$i"; done
}
if [ "$sharded" = 1 ]; then
  echo "== serving: $shards sharded monolith-serving nodes, node i holds PS shard i and reads the others from its peers (follows every 100 ms, dense every ${sync_ms} ms; the node of shard 0 logs impressions)"
  ports=()
  for i in $(seq 0 $((shards - 1))); do
    ports+=("$(free_port)") || { echo "no free port"; exit 1; }
  done
  for i in $(seq 0 $((shards - 1))); do
    peers=""
    for j in $(seq 0 $((shards - 1))); do
      [ "$j" = "$i" ] || peers="$peers${peers:+,}127.0.0.1:${ports[$j]}"
    done
    name=serving lograte=1
    [ "$i" = 0 ] || { name="serving_s$i"; lograte=0; }
    serving "$name" "$sync_ms" "$lograte" 100 "127.0.0.1:${ports[$i]}" \
      --set "serving.shards=$i" --set "serving.peers=$peers"
  done
  for name in serving $(serving_nodes); do
    wait_file "$run/$name.port" || { cat "$run/$name.log"; exit 1; }
    echo "   $name: 127.0.0.1:$(cat "$run/$name.port")"
  done
else
  echo "== serving: monolith-serving (follows the shards' changes every 100 ms, dense every ${sync_ms} ms; logs impressions to features)"
  serving serving "$sync_ms" 1 100
  wait_file "$run/serving.port" || { cat "$run/serving.log"; exit 1; }
  echo "   127.0.0.1:$(cat "$run/serving.port")"
fi
start_prometheus

# The synthetic world (data/gen.h), on a clock 10x the wall clock: 5,000 users, 2,000 live
# items of which 50 are born per wall second and whose popularity halves every 30 wall
# seconds of age, item vectors turning once per 6 wall minutes. A model that stops learning
# meets new items it never saw and users whose tastes moved.
world=(--seed 1 --users 5000 --items 2000 --items-born-per-s 5 --item-half-life-s 300
       --drift-period-s 3600 --time-scale 10)
targets=(--serving "serving=127.0.0.1:$(cat "$run/serving.port")")
if [ "$mode" = compare ]; then
  for iv in $intervals; do
    n=$(name_of "$iv")
    targets+=(--serving "sync_$n=@$run/sync_$n.port")
  done
fi

echo "== load: monolith-loadgen, $rate pages/s of $k candidates for ${total}s (progress every 5 s)"
"$bin/loadgen/monolith-loadgen" "${targets[@]}" --kafka "$bootstrap" --rate "$rate" \
  --candidates "$k" --duration-s "$total" --window-s 10 --inflight 4 "${world[@]}" \
  --series "$run/auc.tsv" --report "$run/loadgen.json" "${loadgen_extra[@]}" \
  > /dev/null 2> "$run/loadgen.log" &
loadgen=$!
track loadgen
tail -f "$run/loadgen.log" --pid "$loadgen" 2>/dev/null | grep --line-buffered -v "^$" >&2 &

if [ "$mode" = compare ]; then
  sleep "$warmup"
  echo "== compare: replicas with sync intervals ($intervals) ms start now, after ${warmup}s of training"
  for iv in $intervals; do
    serving "sync_$(name_of "$iv")" "$iv" 0
  done
fi

wait "$loadgen" || { echo "loadgen failed: see $run/loadgen.log"; tail -5 "$run/loadgen.log"; exit 1; }
sleep 1

echo "== report"
lagline=""
for name in serving $(serving_nodes) $(ls "$run" | sed -n 's/^\(sync_.*\)\.port$/\1/p'); do
  mp=$(metrics_port "$run/$name.log")
  [ -n "$mp" ] || continue
  scrape "$mp" > "$run/$name.metrics" 2>/dev/null || true
done
prom_report
printf 'loadgen: '; cat "$run/loadgen.json"
echo "   (waiting for the joiner to close the last windows and the trainer to finish)"
wait "$joiner" || echo "joiner failed: see $run/joiner.log"
wait "$trainer" || echo "trainer failed: see $run/trainer.log"
[ -s "$run/joiner.json" ] && { printf 'joiner:  '; cat "$run/joiner.json"; }
[ -s "$run/report.json" ] && { printf 'trainer: '; cat "$run/report.json"; }
if [ -s "$run/serving.metrics" ]; then
  echo "serving: sync (from its /metrics, in $run/serving.metrics):"
  grep -E "^monolith_serving_(sync|dense|rows|predict|peer|shard_held|remote)[a-z_]*(\{[^}]*\})? " \
    "$run/serving.metrics" | grep -vE "_bucket" | head -30 | sed 's/^/   /'
fi
for name in $(serving_nodes); do
  [ -s "$run/$name.metrics" ] || continue
  printf '%s: ' "$name"
  grep -E "^monolith_serving_(rows|shard_held|peer_lookups_total|peer_failures_total|predict_requests_total)[{ ]" \
    "$run/$name.metrics" | awk '{ printf "%s=%s ", $1, $2 } END { print "" }'
done
for i in $(seq 0 $((shards - 1))); do
  printf 'shard %d: ' "$i"
  "$bin/cli/monolith" stats --addr "127.0.0.1:$(cat "$run/ps$i.port")" | head -c 300; echo
done

echo "== serving AUC over time (window 10 s; truth = the ground-truth model on the same clicks)"
awk -F'\t' 'NR > 1 { t[$1] = 1; a[$1, $2] = $3; n[$2] = 1 }
  END {
    m = 0; for (x in n) names[++m] = x
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (names[j] < names[i]) { s = names[i]; names[i] = names[j]; names[j] = s }
    printf "%8s", "t_s"; for (i = 1; i <= m; i++) printf "  %10s", names[i]; printf "\n"
    k = 0; for (x in t) ts[++k] = x + 0
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (ts[j] < ts[i]) { s = ts[i]; ts[i] = ts[j]; ts[j] = s }
    for (i = 1; i <= k; i++) {
      printf "%8.0f", ts[i]
      for (j = 1; j <= m; j++) { v = a[sprintf("%.1f", ts[i]), names[j]]; printf "  %10s", v == "" ? "-" : substr(v, 1, 6) }
      printf "\n"
    }
  }' "$run/auc.tsv"

if [ "$mode" = compare ]; then
  cp "$run/auc.tsv" "$run/sync-compare.tsv"
  # mean AUC per replica over the windows where all of them answered
  summary=$(sed -n 's/.*"targets": {\(.*\)}}/\1/p' "$run/loadgen.json")
  echo "== paired mean AUC per sync interval (same pages, same clicks)"
  printf '%s\n' "$summary" | tr '}' '\n' | \
    sed -n 's/^[, ]*"\([^"]*\)": {.*"paired_auc": \([-0-9.enul]*\).*/   \1  \2/p'
  if command -v gnuplot > /dev/null; then
    truth=$(sed -n 's/.*"truth_auc": \([0-9.]*\).*/\1/p' "$run/loadgen.json")
    plot=""
    for iv in $intervals; do
      n=$(name_of "$iv")
      # one file per replica, so that gnuplot joins its points with lines
      awk -F'\t' -v n="sync_$n" -v w="$warmup" 'NR > 1 && $2 == n { print $1 - w "\t" $3 }' \
        "$run/auc.tsv" > "$run/auc-sync_$n.tsv"
      label=$([ "$iv" = none ] && echo "no sync after the first" || echo "sync every $n")
      plot="$plot${plot:+, }'$run/auc-sync_$n.tsv' using 1:2 with linespoints lw 2 title '$label'"
    done
    gnuplot <<EOF 2> "$run/gnuplot.log" || echo "gnuplot failed: see $run/gnuplot.log"
set terminal png size 900,540 noenhanced
set output '$run/sync-compare.png'
set datafile separator '\t'
set key bottom right
set xlabel 'seconds since the replicas started (after ${warmup} s of training); 10 s windows'
set ylabel 'serving AUC against the clicks'
set title 'Serving AUC by parameter sync interval (same pages, same clicks; ground truth ${truth:-?})'
set grid
plot $plot
EOF
    [ -s "$run/sync-compare.png" ] && echo "   plot: $run/sync-compare.png"
  else
    echo "   gnuplot missing (apt-get install gnuplot-nox): no plot"
  fi
fi
