#!/usr/bin/env bash
# bench/soak.sh - the soak benchmark (issue #7): the whole loop of deploy/local-cluster.sh
# for many minutes on a stream of mostly new ids, with a short TTL and a frequency filter on
# every slot, so that without expiry the tables would grow without bound. Checks that expiry
# keeps each daemon's resident memory flat and Predict latency steady.
#
#   bash bench/soak.sh [--minutes M (10)] [--quick] [--shards N (2)] [--rate PAGES_PER_S (200)]
#                      [--ttl S (90; 0: no expiry, the control run)] [--min-count C (2)]
#                      [--interval S (5)] [--out DIR (build/soak)] [--set section.key=value]...
#   bash bench/soak.sh --analyze DIR    (the summary again, from the files of a run in DIR)
#
# The loop is deploy/local-cluster.sh itself, through its hooks (MT_CLUSTER_SETS: the TTL,
# filter and metrics overrides for every daemon; MT_LOADGEN_ARGS: a fast-turning synthetic
# world and the per-minute latency series; $run/pids). Every second it reads each process's
# VmRSS (/proc/PID/status, by bash itself: no process started); every --interval seconds
# the daemons' /metrics: PS rows, inserts, evictions, filtered; serving rows, deletions,
# sync lag, Predict count and histogram (mean and p99 of the interval, the p99 interpolated
# in the histogram's buckets); trainer examples/s and Kafka lag; joiner pending
# impressions; and the CPU this loop and the rest of the machine used (the noise). Outputs
# (in DIR):
#
#   samples.jsonl  one JSON object per sample ({"type": "sample", ...}), then the summary
#                  ({"type": "summary", ...}); the same lines go to stdout
#   samples.tsv    the samples as a table; rss.tsv: RSS every second; latency.tsv:
#                  loadgen's client-side Predict latency percentiles of each minute;
#                  smaps/: /proc/PID/smaps_rollup of each process at half time and at the
#                  end; summary.txt: the human summary; loop/: the loop's logs and reports
#
# and the human summary on stderr: per process the least-squares RSS slope over the second
# half of the run (after the TTL has filled the tables) in MiB/min and in % of its level a
# minute, its growth, its peak of each minute; PS and serving rows, inserts and evictions;
# p50/p99 per minute and their drift; the verdict. Criterion (docs/soak.md): a daemon's
# memory is flat when |slope| <= 1% of its mean RSS a minute over the second half; the run
# PASSes when every PS shard, the serving replica, the trainer and the joiner are flat. The
# broker (monolith-kafka-dev) and the load generator are the test harness: reported, not
# judged. The summary also states the criterion's power: how fast each PS shard would grow
# if nothing expired (its inserts a minute x MT_SOAK_ROW_BYTES, 110 B: measured by the
# control run, --ttl 0), in multiples of the threshold.
#
# --quick (about 80 s, TTL 20 s): a smoke test of the mechanics. It fails (exit 1) only if
# a daemon died, /metrics stopped answering, or nothing was inserted, evicted or deleted;
# its slopes are printed but judge nothing (too short). A full run exits 1 on those
# failures and also when the memory verdict is FAIL (latency drift is reported, never
# judged: the machine is shared). Binaries from $MT_BIN (default build/release).
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
minutes=10 quick=0 shards=2 rate=200 ttl=90 ttl_set=0 min_count=2 interval=5
out=build/soak extra_sets="" analyze_dir=""
log() { echo "$*" >&2; }
usage() {
  sed -n '7,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --minutes) minutes=$2; shift ;;
    --shards) shards=$2; shift ;;
    --rate) rate=$2; shift ;;
    --ttl) ttl=$2; ttl_set=1; shift ;;
    --min-count) min_count=$2; shift ;;
    --interval) interval=$2; shift ;;
    --out) out=$2; shift ;;
    --set) extra_sets="$extra_sets $2"; shift ;;
    --analyze) analyze_dir=$2; shift ;;
    *) usage ;;
  esac
  shift
done
seconds=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 + 0.5 }')
if [ "$quick" = 1 ]; then
  seconds=80
  [ "$ttl_set" = 1 ] || ttl=20
fi
[ "$seconds" -ge 30 ] || { echo "soak: --minutes too small" >&2; exit 2; }
[[ $interval =~ ^[1-9][0-9]*$ ]] || { echo "soak: --interval: whole seconds" >&2; exit 2; }
# ---------------- analysis (also: --analyze DIR, on the files of an earlier run) ----------------
analyze() {
# The second half: t >= seconds / 2. Slopes are least squares of y on t in minutes.
# row_bytes: resident bytes one insert costs a PS shard when nothing expires, measured by
# the control run (--ttl 0: docs/soak.md); the power figure uses it.
row_bytes=${MT_SOAK_ROW_BYTES:-110}
summary_json=$(awk -F'\t' -v T="$seconds" -v quick="$quick" -v ttl="$ttl" -v shards="$shards" \
  -v died="$died" -v failed="$failed_samples" -v latf="$outabs/latency.tsv" -v rb="$row_bytes" '
  # fit(X, Y, N): least squares of Y[1..N] on X[1..N]; sets FS_ (slope), FM_ (mean of Y),
  # FE_ (standard error of the slope, white-noise model: a lower bound on a correlated series)
  function fit(X, Y, N,   i, sx, sy, sxx, sxy, b, a, r, sse, den) {
    FS_ = FM_ = FE_ = "null"
    if (N < 3) return
    sx = sy = sxx = sxy = 0
    for (i = 1; i <= N; i++) { sx += X[i]; sy += Y[i]; sxx += X[i] * X[i]; sxy += X[i] * Y[i] }
    den = N * sxx - sx * sx
    if (den == 0) return
    b = (N * sxy - sx * sy) / den; a = (sy - b * sx) / N
    sse = 0
    for (i = 1; i <= N; i++) { r = Y[i] - a - b * X[i]; sse += r * r }
    FS_ = b; FM_ = sy / N; FE_ = sqrt(sse / (N - 2) / (sxx - sx * sx / N))
  }
  # series(FILE_ROWS, column, from, to): X (minutes) and Y of the non-null values in [from, to)
  function series(R, c, from, to,   i, n) {
    delete SX; delete SY; n = 0
    for (i = 1; i <= R["n"]; i++) {
      if (R[i, 1] < from || R[i, 1] >= to || R[i, c] == "null" || R[i, c] == "") continue
      n++; SX[n] = R[i, 1] / 60; SY[n] = R[i, c]
    }
    return n
  }
  function firstv(R, c, from,   i) { for (i = 1; i <= R["n"]; i++) if (R[i, 1] >= from && R[i, c] != "null" && R[i, c] != "") return R[i, c]; return "null" }
  function lastv(R, c,   i) { for (i = R["n"]; i >= 1; i--) if (R[i, c] != "null" && R[i, c] != "") return R[i, c]; return "null" }
  function j(x) { return (x == "null" || x == "") ? "null" : sprintf("%.4g", x) }
  function f(fmt, x) { return (x == "null" || x == "") ? "-" : sprintf(fmt, x) }
  function abs(x) { return x < 0 ? -x : x }
  FNR == 1 { file++; for (c = 1; c <= NF; c++) { if (file == 1) rname[c] = $c; else col[$c] = c }; if (file == 1) rnc = NF; next }
  file == 1 { n = ++RS_["n"]; for (c = 1; c <= NF; c++) RS_[n, c] = $c; next }
  file == 2 { n = ++SM["n"]; for (c = 1; c <= NF; c++) SM[n, c] = $c; next }
  END {
    half = T / 2; big = 1e18
    out = "{\"type\": \"summary\", \"seconds\": " T ", \"rss_samples\": " RS_["n"] ", \"samples\": " SM["n"]
    out = out ", \"second_half_from_s\": " half ", \"ttl_s\": " ttl ", \"quick\": " (quick ? "true" : "false")
    verdict = "PASS"; judged = ""; fails = ""
    nfull = int(T / 60 + 1e-9)           # full minutes of the run
    h = sprintf("== RSS, MiB (every second; the second half is t >= %ds)\n", half)
    h = h "   slope: least squares over the samples of the second half (+- its standard error, white-noise model);\n"
    h = h "   flat: |slope| <= 1% of the mean RSS of the second half a minute. peaks: the largest RSS of each\n"
    h = h "   full minute (spikes: checkpoints, memtable flushes) and their slope over the second half.\n"
    h = h sprintf("%-9s %7s %7s %8s %8s %17s %8s %10s  %s\n", "process", "first", "last", "growth", "mean", "slope MiB/min", "%/min", "peaks/min", "verdict")
    out = out ", \"rss\": {"
    for (c = 2; c <= rnc; c++) {
      d = rname[c]
      n = series(RS_, c, half, big); fit(SX, SY, n); slope = FS_; se = FE_; level = FM_
      # per-minute peaks
      pk = ""; np = 0; delete PX; delete PY
      for (m = 0; m < nfull; m++) {
        mx = "null"
        for (i = 1; i <= RS_["n"]; i++) {
          t = RS_[i, 1]; v = RS_[i, c]
          if (t <= m * 60 || t > m * 60 + 60 || v == "null" || v == "") continue
          if (mx == "null" || v + 0 > mx) mx = v + 0
        }
        pk = pk (m ? ", " : "") j(mx)
        if (m * 60 >= half && mx != "null") { np++; PX[np] = m + 0.5; PY[np] = mx }
      }
      fit(PX, PY, np); ps = FS_; pm = FM_
      pct = (slope == "null" || level == 0) ? "null" : 100 * slope / level
      f0 = firstv(RS_, c, 0); fl = lastv(RS_, c)
      growth = (f0 == "null" || fl == "null") ? "null" : fl - f0
      judge = (d ~ /^ps[0-9]+$/ || d == "serving" || d == "trainer" || d == "joiner")
      flat = (pct != "null" && abs(pct) <= 1.0)
      if (judge) { judged = judged " " d; if (!flat) { verdict = "FAIL"; fails = fails " " d } }
      out = out (c > 2 ? ", " : "") "\"" d "\": {\"slope_mib_per_min\": " j(slope) ", \"slope_se\": " j(se)
      out = out ", \"mean_mib\": " j(level) ", \"slope_pct_per_min\": " j(pct)
      out = out ", \"peak_slope_mib_per_min\": " j(ps) ", \"peak_mean_mib\": " j(pm)
      out = out ", \"first_mib\": " j(f0) ", \"last_mib\": " j(fl) ", \"growth_mib\": " j(growth)
      out = out ", \"minute_peaks_mib\": [" pk "], \"judged\": " (judge ? "true" : "false") ", \"flat\": " (flat ? "true" : "false") "}"
      h = h sprintf("%-9s %7s %7s %8s %8s %8s +-%6s %8s %10s  %s\n", d, f("%.1f", f0), f("%.1f", fl), f("%+.1f", growth),
        f("%.1f", level), f("%+.3f", slope), f("%.3f", se), f("%+.2f%%", pct), f("%+.3f", ps),
        !judge ? "(harness: not judged)" : quick ? "(quick: not judged)" : pct == "null" ? "-" : flat ? "flat" : "NOT FLAT")
      PK[d] = pk
    }
    out = out "}"
    h = h "   peaks by minute:\n"
    for (c = 2; c <= rnc; c++) h = h sprintf("   %-9s %s\n", rname[c], PK[rname[c]])

    # PS shards: rows, inserts, evictions; the power of the criterion
    out = out ", \"ps\": ["
    h = h "== PS shards (second half)\n"
    power_min = -1; tot_ins = tot_ev = 0
    for (i = 0; i < shards; i++) {
      p = "ps" i
      n = series(SM, col[p "_rows"], half, big); fit(SX, SY, n); rs = FS_; rm = FM_
      ins0 = firstv(SM, col[p "_inserts"], half); ins1 = lastv(SM, col[p "_inserts"])
      ev0 = firstv(SM, col[p "_evictions"], half); ev1 = lastv(SM, col[p "_evictions"])
      fl1 = lastv(SM, col[p "_filtered"]); r1 = lastv(SM, col[p "_rows"])
      cap1 = lastv(SM, col[p "_capacity"]); tb1 = lastv(SM, col[p "_table_bytes"])
      span = (T - half) / 60
      ipm = (ins0 != "null" && ins1 != "null") ? (ins1 - ins0) / span : 0
      epm = (ev0 != "null" && ev1 != "null") ? (ev1 - ev0) / span : 0
      # the threshold of this shard (1% of its mean level a minute) against the growth
      # without expiry (every insert stays: inserts/min x the resident bytes of a row)
      thr = 0
      for (c = 2; c <= rnc; c++) if (rname[c] == p) { n = series(RS_, c, half, big); fit(SX, SY, n); thr = (FM_ == "null") ? 0 : FM_ * 0.01 }
      grow = ipm * rb / 1048576
      power = thr > 0 ? grow / thr : 0
      if (power_min < 0 || power < power_min) power_min = power
      tot_ins += (ins1 == "null" ? 0 : ins1); tot_ev += (ev1 == "null" ? 0 : ev1)
      out = out (i ? ", " : "") "{\"rows_last\": " j(r1) ", \"rows_mean\": " j(rm) ", \"rows_slope_per_min\": " j(rs)
      out = out ", \"capacity_last\": " j(cap1) ", \"table_bytes_last\": " j(tb1)
      out = out ", \"inserts_total\": " j(ins1) ", \"evictions_total\": " j(ev1) ", \"filtered_total\": " j(fl1)
      out = out ", \"inserts_per_min\": " j(ipm) ", \"evictions_per_min\": " j(epm)
      out = out ", \"no_expiry_growth_mib_per_min\": " j(grow) ", \"power\": " j(power) "}"
      h = h sprintf("%-4s rows %s (mean %s, %s/min), capacity %s; %s inserts/min, %s evictions/min (totals %s, %s; filtered %s)\n",
        p, r1, f("%.0f", rm), f("%+.0f", rs), cap1, f("%.0f", ipm), f("%.0f", epm), ins1, ev1, fl1)
      h = h sprintf("     without expiry: +%.2f MiB/min (%d B a row) = %.1fx the threshold of %.2f MiB/min\n", grow, rb, power, thr)
    }
    out = out "]"
    n = series(SM, col["serving_rows"], half, big); fit(SX, SY, n); srs = FS_; srm = FM_
    sdel = lastv(SM, col["serving_deleted"]); srl = lastv(SM, col["serving_rows"])
    full = lastv(SM, col["full_syncs"])
    n = series(SM, col["sync_lag_max_s"], half, big); fit(SX, SY, n); lagm = FM_
    lagmax = 0; for (i = 1; i <= n; i++) if (SY[i] > lagmax) lagmax = SY[i]
    n = series(SM, col["trainer_ex_per_s"], half, big); fit(SX, SY, n); exm = FM_
    n = series(SM, col["trainer_lag"], half, big); fit(SX, SY, n); tlagm = FM_
    n = series(SM, col["joiner_pending"], half, big); fit(SX, SY, n); jpm = FM_
    n = series(SM, col["joiner_pending_memory"], half, big); fit(SX, SY, n); jpmm = FM_
    n = series(SM, col["cpu_ours_cores"], 0, big); fit(SX, SY, n); cpo = FM_
    n = series(SM, col["cpu_others_cores"], 0, big); fit(SX, SY, n); cpx = FM_
    cpxmax = 0; for (i = 1; i <= n; i++) if (SY[i] > cpxmax) cpxmax = SY[i]
    n = series(SM, col["predict_mean_ms"], half, big); fit(SX, SY, n); pm_s = FS_; pm_m = FM_
    out = out ", \"serving\": {\"rows_last\": " j(srl) ", \"rows_mean\": " j(srm) ", \"rows_slope_per_min\": " j(srs)
    out = out ", \"sync_deleted_total\": " j(sdel) ", \"full_syncs\": " j(full) ", \"sync_lag_mean_s\": " j(lagm) ", \"sync_lag_max_s\": " j(lagmax)
    out = out ", \"predict_mean_ms\": " j(pm_m) ", \"predict_mean_slope_ms_per_min\": " j(pm_s) "}"
    out = out ", \"trainer\": {\"examples_per_s\": " j(exm) ", \"kafka_lag_mean\": " j(tlagm) "}"
    out = out ", \"joiner\": {\"pending_mean\": " j(jpm) ", \"pending_memory_mean\": " j(jpmm) "}"
    out = out ", \"cpu\": {\"ours_cores_mean\": " j(cpo) ", \"others_cores_mean\": " j(cpx) ", \"others_cores_max\": " j(cpxmax) "}"
    h = h sprintf("serving rows %s (mean %s, %s/min); deletions applied %s; full syncs %s; sync lag mean %s s, max %s s\n",
      srl, f("%.0f", srm), f("%+.0f", srs), sdel, full, f("%.2f", lagm), f("%.2f", lagmax))
    h = h sprintf("trainer %s examples/s, Kafka lag %s messages; joiner %s pending impressions, %s in memory (means, second half)\n",
      f("%.0f", exm), f("%.0f", tlagm), f("%.0f", jpm), f("%.0f", jpmm))
    h = h sprintf("CPU: this loop %s cores; other processes of the machine %s cores on average, %s at most (the noise)\n",
      f("%.2f", cpo), f("%.2f", cpx), f("%.2f", cpxmax))

    # latency: loadgen per minute (exact), drift over minutes 2.. (the first is the warm-up)
    nm = 0
    while ((getline line < latf) > 0) {
      split(line, a, "\t"); if (a[1] == "t_s") continue
      nm++; lm[nm] = a[1]; ln[nm] = a[2]; l50[nm] = a[4]; l90[nm] = a[5]; l99[nm] = a[6]
    }
    out = out ", \"latency_per_minute\": ["
    h = h "== Predict latency per minute (loadgen, client side, exact)\n   minute  requests   p50 ms   p90 ms   p99 ms\n"
    n = 0; delete X50; delete Y50; delete Y99
    for (i = 1; i <= nm; i++) {
      out = out (i > 1 ? ", " : "") "{\"t_s\": " lm[i] ", \"n\": " ln[i] ", \"p50_ms\": " l50[i] ", \"p90_ms\": " l90[i] ", \"p99_ms\": " l99[i] "}"
      h = h sprintf("   %6d %9d %8.3f %8.3f %8.3f%s\n", lm[i] / 60, ln[i], l50[i], l90[i], l99[i], i == 1 ? "  (warm-up: not in the drift)" : "")
      if (i > 1) { n++; X50[n] = lm[i] / 60; Y50[n] = l50[i]; Y99[n] = l99[i] }
    }
    out = out "]"
    fit(X50, Y50, n); d50 = (FS_ == "null") ? "null" : 100 * FS_ / FM_; m50 = FM_
    fit(X50, Y99, n); d99 = (FS_ == "null") ? "null" : 100 * FS_ / FM_; m99 = FM_
    out = out ", \"latency_drift_pct_per_min\": {\"p50\": " j(d50) ", \"p99\": " j(d99) "}"
    h = h sprintf("   drift over minutes 2..%d (least squares, %% of the mean a minute): p50 %s, p99 %s\n", nm, f("%+.2f%%", d50), f("%+.2f%%", d99))
    h = h sprintf("   serving-side mean Predict time (histogram sum/count, second half): %s ms, %s ms/min\n", f("%.3f", pm_m), f("%+.4f", pm_s))

    mech = ""
    if (died != "") mech = mech " died:" died
    # a scrape may time out on a loaded machine (3 s); a daemon that stopped answering fails most
    if (failed > SM["n"] / 5) mech = mech " failed_scrapes:" failed
    if (tot_ins == 0) mech = mech " no_inserts"
    if (ttl > 0 && tot_ev == 0) mech = mech " no_evictions"
    if (ttl > 0 && (sdel == "null" || sdel == 0)) mech = mech " serving_deleted_nothing"
    if (SM["n"] < 5) mech = mech " too_few_samples"
    if (quick) verdict = "INFORMATIONAL"
    else if (ttl == 0) verdict = "CONTROL"
    out = out ", \"power_min\": " j(power_min) ", \"judged\": \"" substr(judged, 2) "\", \"not_flat\": \"" substr(fails, 2) "\""
    out = out ", \"mechanics\": \"" (mech == "" ? "ok" : substr(mech, 2)) "\", \"verdict\": \"" verdict "\"}"
    print out
    h = h sprintf("== mechanics: %s\n", mech == "" ? "ok (every daemon alive, /metrics answering, rows inserted, evicted and deleted from serving)" : substr(mech, 2))
    if (failed > 0) h = h sprintf("   (%d scrapes of PS or serving went unanswered in 3 s)\n", failed)
    if (!quick && ttl > 0 && power_min < 3) h = h sprintf("   WARNING: little power: without expiry a shard would grow only %.1fx the threshold\n", power_min)
    if (verdict == "FAIL") h = h "== verdict: FAIL (not flat:" fails ")\n"
    else if (verdict == "PASS") h = h "== verdict: PASS (flat:" judged ")\n"
    else if (verdict == "CONTROL") h = h "== verdict: none (--ttl 0 is the control run: nothing expires, the tables must grow)\n"
    else h = h "== verdict: none (--quick: too short to judge flatness; the mechanics above are the test)\n"
    printf "%s", h > "/dev/stderr"
  }' "$outabs/rss.tsv" "$outabs/samples.tsv" 2> "$outabs/summary.txt")
if [ -n "$analyze_dir" ]; then
  echo "$summary_json"
else
  echo "$summary_json" | tee -a "$outabs/samples.jsonl"
fi
cat "$outabs/summary.txt" >&2
case "$summary_json" in
  *'"mechanics": "ok"'*) ;;
  *) log "soak: FAILED (mechanics)"; exit 1 ;;
esac
case "$summary_json" in *'"verdict": "FAIL"'*) exit 1 ;; esac
exit 0
}
if [ -n "$analyze_dir" ]; then
  outabs=$(cd "$analyze_dir" && pwd)
  out=$analyze_dir
  [ -f "$outabs/run.env" ] || { log "soak: $analyze_dir holds no run of bench/soak.sh"; exit 2; }
  # shellcheck disable=SC1091
  . "$outabs/run.env"
  analyze
fi

export MT_BIN=${MT_BIN:-build/release}
[ -x "$MT_BIN/loadgen/monolith-loadgen" ] || {
  echo "soak: no binaries in $MT_BIN (set MT_BIN, or build: cmake --build build/release)" >&2
  exit 2
}
mkdir -p "$out"
outabs=$(cd "$out" && pwd)
loop="$outabs/loop"
# (the loop's folder too: a pids file left by an earlier run must not be read as this one's)
rm -rf "$loop" "$outabs/samples.jsonl" "$outabs/samples.tsv" "$outabs/rss.tsv" \
  "$outabs/latency.tsv" "$outabs/summary.txt"

# The world (data/include/mt/gen.h through monolith-loadgen, whose generator clock runs
# --time-scale 10 times the wall clock): ids are born at a constant rate, each lives a
# fixed time, and a dead id never comes back, so every row becomes idle within a minute of
# its id's birth and only expiry removes it. Popularity is nearly flat (Zipf 0.5 instead of
# the defaults' ~1): under a steep Zipf most ids are drawn once and never pass the
# frequency filter, and the table would barely grow even without expiry.
#  - users: 4,000 live, 10 born per generator second = 100 per wall second, so a user lives
#    40 wall seconds and is drawn about twice (200 pages/s x 40 s / 4,000);
#  - items: 20,000 live, 50 born per generator second = 500 per wall second, an item lives
#    40 wall seconds and is a candidate about 4 times (2,000 candidates/s x 40 s / 20,000),
#    no fading by age;
#  - tags: a vocabulary of 4 billion, so an item's 1-3 tags are its own (content ids, as
#    ids of creatives or text tokens would be): they are born and die with it. This triples
#    the new ids per item, which the criterion needs to tell flat from growing (the power
#    figure of the summary; docs/soak.md).
# Categories (64), segments (16) and hours (24) stay fixed vocabularies: rows that are
# touched all the time and must NOT expire.
world="--users 4000 --users-born-per-s 10 --user-zipf 0.5"
world="$world --items 20000 --items-born-per-s 50 --item-zipf 0.5 --item-half-life-s 0"
world="$world --tags 4000000000 --time-scale 10"
export MT_LOADGEN_ARGS="$world --latency-series $outabs/latency.tsv --latency-interval-s 60"
# Every slot (the trainer derives 12: embedding and first-order weight of slots 1-6) gets
# the TTL and the filter; the PS ticks expiry every second; the joiner exposes /metrics.
# --set adds overrides (to investigate: e.g. ps.snapshot_interval_s=60).
export MT_CLUSTER_SETS="trainer.ttl_s=$ttl trainer.min_count=$min_count \
ps.expire_interval_ms=1000 joiner.metrics_listen=127.0.0.1:0$extra_sets"
export MT_RUN_DIR="$loop"

log "== soak: ${seconds}s, $shards PS shards, $rate pages/s x 10 candidates, TTL ${ttl}s," \
  "min_count $min_count, sample every ${interval}s (binaries: $MT_BIN; output: $out)"
bash deploy/local-cluster.sh --seconds "$seconds" --rate "$rate" --shards "$shards" \
  > "$outabs/cluster.out" 2>&1 &
cluster=$!
cleanup() {
  if kill -0 "$cluster" 2>/dev/null; then
    kill "$cluster" 2>/dev/null || true
    wait "$cluster" 2>/dev/null || true
  fi
  # whatever the loop started and left behind (its own trap normally ends them)
  if [ -s "$loop/pids" ]; then
    while read -r _ p; do kill "$p" 2>/dev/null || true; done < "$loop/pids"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE

# ---------------- wait for the loop ----------------
for _ in $(seq 1200); do
  grep -q '^loadgen ' "$loop/pids" 2>/dev/null && break
  kill -0 "$cluster" 2>/dev/null || { tail -20 "$outabs/cluster.out" >&2; exit 1; }
  sleep 0.1
done
grep -q '^loadgen ' "$loop/pids" 2>/dev/null || { log "soak: the loop did not start"; exit 1; }
declare -A pid port
names=()
while read -r n p; do
  pid[$n]=$p
  names+=("$n")
done < "$loop/pids"
# The Prometheus port a daemon announced in its log ("metrics on port N").
metrics_port() { sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -1 || true; }
daemons=()
for i in $(seq 0 $((shards - 1))); do daemons+=("ps$i"); done
daemons+=(serving trainer joiner)
for _ in $(seq 300); do
  missing=0
  for n in "${daemons[@]}"; do
    [ -n "${port[$n]:-}" ] && continue
    port[$n]=$(metrics_port "$loop/$n.log")
    [ -n "${port[$n]}" ] || missing=1
  done
  [ "$missing" = 0 ] && break
  sleep 0.2
done
for n in "${daemons[@]}"; do
  [ -n "${port[$n]:-}" ] || { log "soak: no metrics port in $loop/$n.log"; exit 1; }
done

# ---------------- sampling ----------------
# Each second: every process's VmRSS (read by bash itself: no process is started, so the
# sampling does not perturb what it measures) into rss.tsv. Every --interval seconds also
# the daemons' /metrics, one JSON line and one samples.tsv row.
scrape() { # scrape PORT FILE: the /metrics text into FILE (empty if it does not answer)
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" &&
    printf "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n" >&3 && cat <&3' "$1" > "$2" 2>/dev/null ||
    : > "$2"
}
# mvals FILE NAME...: each NAME's value summed over its label sets (max:NAME: the largest),
# "null" when absent; on one line.
mvals() {
  local f=$1
  shift
  awk -v names="$*" 'BEGIN {
      n = split(names, want, " ")
      for (i = 1; i <= n; i++) if (want[i] ~ /^max:/) { mx[i] = 1; want[i] = substr(want[i], 5) }
    }
    { for (i = 1; i <= n; i++) if ($1 == want[i] || index($1, want[i] "{") == 1) {
        if (mx[i]) { if (!(i in v) || $2 + 0 > v[i]) v[i] = $2 + 0 } else v[i] += $2
      } }
    END { for (i = 1; i <= n; i++) printf "%s%s", (i in v) ? sprintf("%.17g", v[i]) : "null", i < n ? " " : "\n" }' "$f"
}
# rss PID: VmRSS in MiB (one decimal) into RSS, "null" if the process is gone.
rss() {
  RSS=null
  local k v
  while read -r k v _; do
    if [ "$k" = VmRSS: ]; then
      RSS=$((v / 1024)).$(((v % 1024) * 10 / 1024))
      return 0
    fi
  done 2> /dev/null < "/proc/$1/status" || true
}
now_us() { local e=$EPOCHREALTIME; NOW_US=$((${e%.*} * 1000000 + 10#${e#*.})); }
# cpu_sample: the machine's busy CPU since the last call, split into this loop's processes
# and everything else (other users of a shared machine: the noise of the figures), in
# cores (CPU_OURS, CPU_OTHERS, "null" at the first call); LOAD1: the 1-minute load average.
cpu_prev_busy=-1 cpu_prev_ours=0 cpu_prev_us=0
cpu_sample() {
  local u ni sy irq sirq st busy ours=0 n us
  local -a fields
  read -r _ u ni sy _ _ irq sirq st _ < /proc/stat
  busy=$((u + ni + sy + irq + sirq + st))
  for n in "${names[@]}"; do
    fields=()
    read -r -a fields 2> /dev/null < "/proc/${pid[$n]}/stat" || true
    [ "${#fields[@]}" -gt 15 ] && ours=$((ours + fields[13] + fields[14]))
  done
  now_us
  us=$NOW_US
  CPU_OURS=null CPU_OTHERS=null
  if [ "$cpu_prev_busy" -ge 0 ]; then
    # jiffies (USER_HZ = 100 on Linux) per second = cores
    local dt=$(((us - cpu_prev_us) / 10000)) do=$((ours - cpu_prev_ours)) db=$((busy - cpu_prev_busy))
    [ "$dt" -gt 0 ] || dt=1
    printf -v CPU_OURS '%d.%02d' $((do / dt)) $((do * 100 / dt % 100))
    local oth=$((db - do))
    [ "$oth" -ge 0 ] || oth=0
    printf -v CPU_OTHERS '%d.%02d' $((oth / dt)) $((oth * 100 / dt % 100))
  fi
  cpu_prev_busy=$busy cpu_prev_ours=$ours cpu_prev_us=$us
  read -r LOAD1 _ < /proc/loadavg
}
# The predict histogram's cumulative counts, one "le count" per line.
hist() { sed -n 's/^monolith_serving_predict_seconds_bucket{le="\([^"]*\)"} \([0-9]*\)$/\1 \2/p' "$1"; }
# derived NOW_HIST PREV_HIST COUNT PREV_COUNT SUM PREV_SUM EX PREV_EX DT: serving's mean,
# p50 and p99 Predict latency (ms) over the interval, and the trainer's examples/s. The
# percentiles are linear within the histogram bucket holding them (bounds 0.1, 0.25, 0.5, 1,
# 2.5 ... ms): coarse; loadgen's per-minute percentiles (latency.tsv) are exact.
derived() {
  awk -v c="$3" -v pc="$4" -v s="$5" -v ps="$6" -v ex="$7" -v pex="$8" -v dt="$9" '
    NR == FNR { prev[$1] = $2; next }
    { le[++n] = $1; d[n] = $2 - prev[$1] }
    END {
      mean = (c != "null" && pc != "null" && c > pc) ? sprintf("%.4f", (s - ps) / (c - pc) * 1000) : "null"
      p[1] = p[2] = "null"
      tot = n ? d[n] : 0
      if (pc != "null" && tot > 0) {
        split("0.5 0.99", qs, " ")
        for (k = 1; k <= 2; k++) {
          want = qs[k] * tot; lo = 0
          for (i = 1; i <= n; i++) {
            if (d[i] >= want) {
              hi = le[i] == "+Inf" ? lo : le[i]
              below = i > 1 ? d[i - 1] : 0
              f = d[i] > below ? (want - below) / (d[i] - below) : 1
              p[k] = sprintf("%.4f", (lo + f * (hi - lo)) * 1000); break
            }
            lo = le[i]
          }
        }
      }
      exs = (ex != "null" && pex != "null" && dt > 0) ? sprintf("%.1f", (ex - pex) / dt) : "null"
      print mean, p[1], p[2], exs
    }' "$2" "$1"
}

scr="$outabs/.scrape"
rm -rf "$scr" "$outabs/smaps"
mkdir -p "$scr" "$outabs/smaps"
: > "$scr/hist.prev"
prev_ex=null prev_cnt=null prev_sum=null prev_t=0
cols="t_s"
for n in "${names[@]}"; do cols="$cols	$n"; done
echo "$cols" > "$outabs/rss.tsv"
cols="t_s"
for n in "${names[@]}"; do cols="$cols	rss_$n"; done
for i in $(seq 0 $((shards - 1))); do
  cols="$cols	ps${i}_rows	ps${i}_inserts	ps${i}_evictions	ps${i}_filtered	ps${i}_capacity	ps${i}_table_bytes"
done
cols="$cols	serving_rows	serving_deleted	serving_table_bytes	sync_lag_max_s	full_syncs"
cols="$cols	predict_count	predict_mean_ms	predict_p50_ms	predict_p99_ms"
cols="$cols	trainer_examples	trainer_ex_per_s	trainer_lag	joiner_pending	joiner_pending_memory"
cols="$cols	cpu_ours_cores	cpu_others_cores	loadavg1"
echo "$cols" > "$outabs/samples.tsv"
ps_metrics="monolith_ps_rows monolith_ps_inserts_total monolith_ps_evictions_total"
ps_metrics="$ps_metrics monolith_ps_filtered_total monolith_ps_capacity monolith_ps_table_bytes"
sv_metrics="monolith_serving_rows monolith_serving_sync_deleted_total monolith_serving_table_bytes"
sv_metrics="$sv_metrics max:monolith_serving_sync_lag_seconds monolith_serving_full_syncs_total"
sv_metrics="$sv_metrics monolith_serving_predict_seconds_count monolith_serving_predict_seconds_sum"
# smaps NAME_SUFFIX: /proc/PID/smaps_rollup of every process (for a post-mortem of growth)
smaps() {
  for n in "${names[@]}"; do cat "/proc/${pid[$n]}/smaps_rollup" > "$outabs/smaps/$n-$1.txt" 2>/dev/null || true; done
}

now_us
t0_us=$NOW_US
tick=0 failed_samples=0 died="" half_done=0
declare -A rssv
log "== sampling RSS every second and /metrics every ${interval}s for ${seconds}s (a line a minute)"
while :; do
  tick=$((tick + 1))
  now_us
  d=$((t0_us + tick * 1000000 - NOW_US))
  if [ "$d" -gt 0 ]; then
    printf -v pause '%d.%06d' $((d / 1000000)) $((d % 1000000))
    sleep "$pause"
  fi
  now_us
  ds=$(((NOW_US - t0_us) / 100000))
  t="$((ds / 10)).$((ds % 10))"
  line="$t"
  for n in "${names[@]}"; do
    rss "${pid[$n]}"
    rssv[$n]=$RSS
    line="$line	$RSS"
    if [ "$RSS" = null ] && ! kill -0 "${pid[$n]}" 2> /dev/null; then
      case " ${daemons[*]} " in *" $n "*) [[ " $died " == *" $n "* ]] || died="$died $n" ;; esac
    fi
  done
  echo "$line" >> "$outabs/rss.tsv"
  if [ "$half_done" = 0 ] && [ $((tick * 2)) -ge "$seconds" ]; then
    smaps half
    half_done=1
  fi
  if [ $((tick % interval)) = 0 ]; then
    for n in "${daemons[@]}"; do scrape "${port[$n]}" "$scr/$n.txt"; done
    json="{\"type\": \"sample\", \"t_s\": $t, \"rss_mib\": {"
    row="$t"
    sep=""
    for n in "${names[@]}"; do
      json="$json$sep\"$n\": ${rssv[$n]}"
      row="$row	${rssv[$n]}"
      sep=", "
    done
    json="$json}, \"ps\": ["
    sep=""
    psrows=0
    for i in $(seq 0 $((shards - 1))); do
      f="$scr/ps$i.txt"
      [ -s "$f" ] || failed_samples=$((failed_samples + 1))
      read -r rows ins ev fl cap tb <<< "$(mvals "$f" $ps_metrics)"
      json="$json$sep{\"rows\": $rows, \"inserts\": $ins, \"evictions\": $ev, \"filtered\": $fl,"
      json="$json \"capacity\": $cap, \"table_bytes\": $tb}"
      row="$row	$rows	$ins	$ev	$fl	$cap	$tb"
      sep=", "
      [ "$rows" = null ] || psrows=$((psrows + rows))
    done
    f="$scr/serving.txt"
    [ -s "$f" ] || failed_samples=$((failed_samples + 1))
    read -r srows sdel stb lag full cnt sum <<< "$(mvals "$f" $sv_metrics)"
    hist "$f" > "$scr/hist.now"
    read -r ex tlag <<< "$(mvals "$scr/trainer.txt" monolith_trainer_examples_total \
      monolith_trainer_consumer_lag_messages)"
    read -r jp jpm <<< "$(mvals "$scr/joiner.txt" monolith_joiner_pending monolith_joiner_pending_memory)"
    cpu_sample
    read -r mean p50 p99 exs <<< "$(derived "$scr/hist.now" "$scr/hist.prev" "$cnt" "$prev_cnt" \
      "$sum" "$prev_sum" "$ex" "$prev_ex" "$(awk -v a="$t" -v b="$prev_t" 'BEGIN { print a - b }')")"
    mv "$scr/hist.now" "$scr/hist.prev"
    json="$json], \"serving\": {\"rows\": $srows, \"sync_deleted\": $sdel, \"table_bytes\": $stb,"
    json="$json \"sync_lag_max_s\": $lag, \"full_syncs\": $full, \"predict_count\": $cnt,"
    json="$json \"predict_mean_ms\": $mean, \"predict_p50_ms\": $p50, \"predict_p99_ms\": $p99},"
    json="$json \"trainer\": {\"examples\": $ex, \"examples_per_s\": $exs, \"kafka_lag\": $tlag},"
    json="$json \"joiner\": {\"pending\": $jp, \"pending_memory\": $jpm},"
    json="$json \"cpu\": {\"ours_cores\": $CPU_OURS, \"others_cores\": $CPU_OTHERS, \"loadavg1\": $LOAD1}}"
    row="$row	$srows	$sdel	$stb	$lag	$full	$cnt	$mean	$p50	$p99	$ex	$exs	$tlag	$jp	$jpm"
    row="$row	$CPU_OURS	$CPU_OTHERS	$LOAD1"
    echo "$json" | tee -a "$outabs/samples.jsonl"
    echo "$row" >> "$outabs/samples.tsv"
    prev_ex=$ex prev_cnt=$cnt prev_sum=$sum prev_t=$t
    if [ $((tick % 60)) = 0 ]; then
      printf -v lagf '%.2f' "${lag/null/0}"
      log "   t=${t}s  PS rows $psrows  serving rows $srows  RSS MiB: ps0 ${rssv[ps0]}" \
        "serving ${rssv[serving]} joiner ${rssv[joiner]} trainer ${rssv[trainer]}" \
        "kafka ${rssv[kafka]}  trainer $exs ex/s  sync lag ${lagf}s"
    fi
  fi
  kill -0 "${pid[loadgen]}" 2>/dev/null || break
  [ "$tick" -ge "$seconds" ] && break
done
smaps end
log "== the loop is ending (waiting for its report)"
wait "$cluster" || log "soak: deploy/local-cluster.sh exited with an error (see $out/cluster.out)"

# the run's parameters, for --analyze
{
  printf 'seconds=%q ttl=%q shards=%q quick=%q\n' "$seconds" "$ttl" "$shards" "$quick"
  printf 'died=%q failed_samples=%q\n' "$died" "$failed_samples"
} > "$outabs/run.env"
rm -rf "$scr"
analyze
