#!/usr/bin/env bash
# bench/cowclip_bench.sh - CowClip's claim in miniature (Zheng et al., AAAI 2023: with
# column-wise clipping of the embedding gradients, a large batch keeps the AUC of a small
# one). monolith-trainer in batch mode on the synthetic stream (`monolith gen`: 1,000,000
# examples, 20,000 users, 5,000 items, seed 5; the first 800,000 train in one pass, the last
# 200,000 evaluate), the model of deploy/trainer.example.conf (FTRL on the rows, dense Adam)
# with MLP 64-32, each setting over several seeds (trainer.seed):
#   b512             batch 512, the configuration's learning rates (the reference)
#   b8k-paper        batch 8192 (s = 16), the paper's scaling: dense lr x sqrt(s), the rows'
#                    lr unchanged; without CowClip
#   b8k-paper-clip   the same with CowClip (trainer.cowclip_ratio 1, cowclip_zeta 0.01)
#   b8k-scaled       batch 8192, dense lr x s, the rows' lr x sqrt(s); without CowClip
#   b8k-scaled-clip  the same with CowClip
# and each setting's eval AUC (mean, std) and its difference to b512's of the same seed.
# (The paper's L2 rule has nothing to scale here: the rows' FTRL runs without L2.)
#
#   bash bench/cowclip_bench.sh [--quick] [--seeds N (5)] [--build DIR]
# --quick: 200,000 examples (160,000 train), one seed.
#
# One JSON line per run ({"bench": "cowclip", ...}), one summary per setting, a conditions line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build/release"
seeds=5
examples=1000000
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) seeds=1; examples=200000 ;;
    --seeds) seeds=$2; shift ;;
    --build) build=$2; shift ;;
    *) echo "cowclip_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
trainer="$build/trainer/monolith-trainer" cli="$build/cli/monolith"
for b in "$trainer" "$cli"; do
  [ -x "$b" ] || { echo "cowclip_bench: $b is missing (bash scripts/build.sh release)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
conf="$here/deploy/trainer.example.conf"
t0=$(date +%s.%N)
"$cli" gen --examples "$examples" --seed 5 --users 20000 --items 5000 > "$tmp/all.tsv"
ntrain=$((examples * 4 / 5))
head -n $((ntrain + 1)) "$tmp/all.tsv" > "$tmp/train.tsv"
{ head -n 1 "$tmp/all.tsv"; tail -n $((examples - ntrain)) "$tmp/all.tsv"; } > "$tmp/eval.tsv"
# the configuration's rates: the base of the scaled ones
lr=$(awk -F'= *' '/^sparse_lr/ { print $2 }' "$conf"); lr=${lr:-0.05}
dlr=$(awk -F'= *' '/^dense_lr/ { print $2 }' "$conf"); dlr=${dlr:-0.001}
scale() { awk -v a="$1" -v f="$2" 'BEGIN { printf "%g", a * f }'; }
clip=(--set trainer.cowclip_ratio=1 --set trainer.cowclip_zeta=0.01)
settings=(b512 b8k-paper b8k-paper-clip b8k-scaled b8k-scaled-clip)
setting_args() {
  case "$1" in
    b512) echo "--set trainer.batch_size=512" ;;
    b8k-paper) echo "--set trainer.batch_size=8192 --set trainer.dense_lr=$(scale "$dlr" 4)" ;;
    b8k-paper-clip) echo "$(setting_args b8k-paper) ${clip[*]}" ;;
    b8k-scaled) echo "--set trainer.batch_size=8192 --set trainer.dense_lr=$(scale "$dlr" 16) --set trainer.sparse_lr=$(scale "$lr" 4)" ;;
    b8k-scaled-clip) echo "$(setting_args b8k-scaled) ${clip[*]}" ;;
  esac
}
runs="$tmp/runs.jsonl"
: > "$runs"
for seed in $(seq 1 "$seeds"); do
  for st in "${settings[@]}"; do
    # shellcheck disable=SC2046 # a word list on purpose
    "$trainer" --config "$conf" --set trainer.hidden=64,32 --set trainer.progress_interval_ms=0 \
      --set trainer.seed="$seed" $(setting_args "$st") --train "$tmp/train.tsv" \
      --eval "$tmp/eval.tsv" --report "$tmp/r.json" > /dev/null 2> "$tmp/r.err" \
      || { cat "$tmp/r.err" >&2; echo "cowclip_bench: $st seed $seed failed" >&2; exit 1; }
    auc=$(sed -n 's/.*"eval_auc": *\([0-9.e+-]*\).*/\1/p' "$tmp/r.json" | head -1)
    ll=$(sed -n 's/.*"eval_logloss": *\([0-9.e+-]*\).*/\1/p' "$tmp/r.json" | head -1)
    line="{\"bench\":\"cowclip\",\"setting\":\"$st\",\"seed\":$seed,\"examples\":$ntrain,\"eval_auc\":$auc,\"eval_logloss\":$ll,\"args\":\"$(setting_args "$st")\"}"
    echo "$line"
    echo "$line" >> "$runs"
  done
done
awk '
  function num(key,   v) { v = $0; if (!match(v, "\"" key "\":[-0-9.e+]+")) return ""; v = substr(v, RSTART, RLENGTH); sub(/^[^:]*:/, "", v); return v + 0 }
  function str(key,   v) { v = $0; match(v, "\"" key "\":\"[^\"]*\""); v = substr(v, RSTART, RLENGTH); sub(/^[^:]*:"/, "", v); sub(/"$/, "", v); return v }
  { st = str("setting"); s = num("seed"); a = num("eval_auc")
    if (!(st in n)) order[++no] = st
    n[st]++; sum[st] += a; sq[st] += a * a; auc[st, s] = a; seeds[st] = seeds[st] " " s }
  END {
    for (i = 1; i <= no; i++) {
      st = order[i]; mean = sum[st] / n[st]; var = sq[st] / n[st] - mean * mean; if (var < 0) var = 0
      d = 0; dd = 0; nd = 0; ns = split(seeds[st], ss, " ")
      for (j = 1; j <= ns; j++) if (("b512", ss[j]) in auc) { x = auc[st, ss[j]] - auc["b512", ss[j]]; d += x; dd += x * x; nd++ }
      dm = nd ? d / nd : 0; dv = nd ? dd / nd - dm * dm : 0; if (dv < 0) dv = 0
      printf "{\"bench\":\"cowclip\",\"summary\":true,\"setting\":\"%s\",\"seeds\":%d,\"eval_auc_mean\":%.4f,\"eval_auc_std\":%.4f,\"vs_b512_mean\":%.4f,\"vs_b512_std\":%.4f}\n", st, n[st], mean, sqrt(var), dm, sqrt(dv)
    }
  }' "$runs"
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "{\"bench\":\"cowclip\",\"metric\":\"conditions\",\"value\":%.3f,\"unit\":\"s\",\"stage\":\"run\"}\n", b - a }'
