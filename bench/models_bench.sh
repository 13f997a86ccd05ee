#!/usr/bin/env bash
# bench/models_bench.sh - the quality of each model family (mt/model.h, `[model] type`) in
# one run: monolith-trainer in batch mode, each family on the same data, several seeds
# (trainer.seed: the dense and embedding initialization), eval AUC and log loss on a held-out
# split, and each family's difference to deepfm's AUC seed by seed.
#
# Data (the first part trains, the rest evaluates; no training on it):
#   - synthetic: `monolith gen` (a hidden ground-truth model over users and items): 40,000
#     examples in time order, the first 30,000 train, the last 10,000 evaluate;
#   - movielens-100k (../shared/data): u.data sorted by time, the first 80% train, the last
#     20% evaluate (mostly users the training period never saw), with the side files; a
#     rating >= 4 is a positive (the reader's rule);
#   - criteo (../shared/data, the 10,000-line sample of the Kaggle set): the first 8,000
#     lines train, the last 2,000 evaluate.
# A real dataset missing (a clone without ../shared) is named on a line of its own and left
# out. The model is deploy/trainer.example.conf's (dim 8) with MLP 64-32; dcnv2 has 3 cross
# layers, full rank and rank 16; mmoe (on the stream with conversions, below) 4 experts of
# width 64 and towers 64-32; din (on the stream with the users' recent clicks, below)
# attention width 32 over 10 behaviours.
#
#   bash bench/models_bench.sh [--quick] [--seeds N (3)] [--build DIR]
# --quick: one seed, the synthetic data only.
#
# One JSON line per run ({"bench": "models", ...}), one summary per dataset and family
# (mean and std of the AUC, mean of the difference to deepfm), and a conditions line.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build/release"
seeds=3
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; seeds=1 ;;
    --seeds) seeds=$2; shift ;;
    --build) build=$2; shift ;;
    *) echo "models_bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
trainer="$build/trainer/monolith-trainer" cli="$build/cli/monolith"
for b in "$trainer" "$cli"; do
  [ -x "$b" ] || { echo "models_bench: $b is missing (bash scripts/build.sh release)" >&2; exit 2; }
done
export MT_SOURCE_DIR="$here"
. "$here/tests/e2e/lib.sh"
data=$(shared_data)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
conf="$here/deploy/trainer.example.conf"
t0=$(date +%s.%N)

# the families: a name and its settings
families=("deepfm" "dcnv2-full" "dcnv2-rank16")
family_args() {
  case "$1" in
    deepfm) echo "--set model.type=deepfm" ;;
    dcnv2-full) echo "--set model.type=dcnv2 --set model.cross_layers=3 --set model.cross_rank=0" ;;
    dcnv2-rank16) echo "--set model.type=dcnv2 --set model.cross_layers=3 --set model.cross_rank=16" ;;
  esac
}

# datasets: name, then the trainer's arguments for it (its train and eval files made here)
datasets=()
"$cli" gen --examples 40000 --seed 11 --users 3000 --items 1000 > "$tmp/all.tsv"
head -n 30001 "$tmp/all.tsv" > "$tmp/syn-train.tsv"
{ head -n 1 "$tmp/all.tsv"; tail -n 10000 "$tmp/all.tsv"; } > "$tmp/syn-eval.tsv"
datasets+=(synthetic)
ml="$data/movielens-100k"
cr="$data/criteo-kaggle-sample/train_head10k.txt"
if [ "$quick" = 0 ]; then
  if [ -f "$ml/u.data" ]; then
    sort -t$'\t' -k4,4n "$ml/u.data" > "$tmp/ml-sorted"
    head -n 80000 "$tmp/ml-sorted" > "$tmp/ml-train"
    tail -n +80001 "$tmp/ml-sorted" > "$tmp/ml-eval"
    datasets+=(movielens-100k)
  else
    echo "models_bench: movielens-100k left out: $ml missing (a clone without ../shared/data)" >&2
  fi
  if [ -f "$cr" ]; then
    head -n 8000 "$cr" > "$tmp/cr-train"
    tail -n +8001 "$cr" > "$tmp/cr-eval"
    datasets+=(criteo)
  else
    echo "models_bench: criteo left out: $cr missing (a clone without ../shared/data)" >&2
  fi
fi
dataset_args() {
  case "$1" in
    synthetic) echo "--train $tmp/syn-train.tsv --eval $tmp/syn-eval.tsv --epochs 2" ;;
    movielens-100k) echo "--set input.format=movielens-100k --set trainer.slots= \
      --set input.users_file=$ml/u.user --set input.items_file=$ml/u.item \
      --train $tmp/ml-train --eval $tmp/ml-eval" ;;
    criteo) echo "--set input.format=criteo --set trainer.slots= \
      --train $tmp/cr-train --eval $tmp/cr-eval" ;;
  esac
}

runs="$tmp/runs.jsonl"
: > "$runs"
for ds in "${datasets[@]}"; do
  for fam in "${families[@]}"; do
    for seed in $(seq 1 "$seeds"); do
      # shellcheck disable=SC2046 # the argument lists are word lists on purpose
      "$trainer" --config "$conf" --set trainer.hidden=64,32 --set trainer.batch_size=256 \
        --set trainer.seed="$seed" --set trainer.progress_interval_ms=0 \
        $(family_args "$fam") $(dataset_args "$ds") --report "$tmp/r.json" \
        > /dev/null 2> "$tmp/r.err" || { cat "$tmp/r.err" >&2; echo "models_bench: $ds $fam seed $seed failed" >&2; exit 1; }
      line=$(awk -v ds="$ds" -v fam="$fam" -v seed="$seed" -v r="$(tr -d '\n' < "$tmp/r.json")" 'BEGIN {
        n = split("examples eval_auc eval_logloss examples_per_s", k, " ")
        out = "{\"bench\":\"models\",\"dataset\":\"" ds "\",\"model\":\"" fam "\",\"seed\":" seed
        for (i = 1; i <= n; i++) {
          v = r; if (!match(v, "\"" k[i] "\": *[-0-9.e+]+")) continue
          v = substr(v, RSTART, RLENGTH); sub(/^[^:]*: */, "", v)
          out = out ",\"" k[i] "\":" v
        }
        print out "}"
      }')
      echo "$line"
      echo "$line" >> "$runs"
    done
  done
done

# Multi-task: the stream with conversions (`monolith gen --tasks 2`: a click, then for a
# clicked example a conversion with a ground truth of its own), mmoe training both tasks at
# once against deepfm trained on each label alone; the eval AUC per task, as datasets
# synthetic-2tasks/click and synthetic-2tasks/conversion.
"$cli" gen --examples 40000 --tasks 2 --seed 11 --users 3000 --items 1000 > "$tmp/all2.tsv"
head -n 30001 "$tmp/all2.tsv" > "$tmp/mt-train.tsv"
{ head -n 1 "$tmp/all2.tsv"; tail -n 10000 "$tmp/all2.tsv"; } > "$tmp/mt-eval.tsv"
mt_run() { # mt_run SEED MODEL TASK-OR-ALL ARGS...: one run, its lines into $runs
  local seed=$1 fam=$2 task=$3; shift 3
  "$trainer" --config "$conf" --set trainer.hidden=64,32 --set trainer.batch_size=256 \
    --set trainer.seed="$seed" --set trainer.progress_interval_ms=0 "$@" \
    --train "$tmp/mt-train.tsv" --eval "$tmp/mt-eval.tsv" --epochs 2 --report "$tmp/r.json" \
    > /dev/null 2> "$tmp/r.err" || { cat "$tmp/r.err" >&2; echo "models_bench: 2 tasks $fam seed $seed failed" >&2; exit 1; }
  python3 - "$tmp/r.json" "$fam" "$seed" "$task" <<'PY' | tee -a "$runs"
import json, sys
r = json.load(open(sys.argv[1]))
fam, seed, task = sys.argv[2], int(sys.argv[3]), sys.argv[4]
aucs = r.get("task_eval_auc", [r["eval_auc"]])
names = ["click", "conversion"] if task == "all" else [task]
for name, auc in zip(names, aucs):
    print(json.dumps({"bench": "models", "dataset": "synthetic-2tasks/" + name, "model": fam,
                      "seed": seed, "examples": r["examples"], "eval_auc": auc,
                      "eval_logloss": r["eval_logloss"] if name == "click" else 0,
                      "examples_per_s": r["examples_per_s"]}, separators=(",", ":")))
PY
}
for seed in $(seq 1 "$seeds"); do
  mt_run "$seed" deepfm click
  mt_run "$seed" deepfm conversion --set input.label=conversion
  mt_run "$seed" mmoe all --set model.type=mmoe --set input.task_labels=conversion
done

# Sequences: the stream with the users' recent clicks (`monolith gen --sequence 10`, slot 7:
# the click truth gains the candidate's closeness to the nearest of them), din (target
# attention of the candidate item over them, in the item slot's rows) against deepfm with
# them as one more sum-pooled slot of its own rows; dataset synthetic-sequence.
"$cli" gen --examples 40000 --sequence 10 --seed 11 --users 3000 --items 1000 > "$tmp/all3.tsv"
head -n 30001 "$tmp/all3.tsv" > "$tmp/sq-train.tsv"
{ head -n 1 "$tmp/all3.tsv"; tail -n 10000 "$tmp/all3.tsv"; } > "$tmp/sq-eval.tsv"
seq_cols="user:1, item:2, segment:3, category:4, hour:5, tags:6:int:multi, sequence:7:int:multi"
for seed in $(seq 1 "$seeds"); do
  for fam in deepfm din; do
    extra=(--set model.type=deepfm)
    [ "$fam" = din ] && extra=(--set model.type=din --set model.sequence_slot=7
      --set model.sequence_query=2 --set model.sequence_length=10)
    "$trainer" --config "$conf" --set trainer.hidden=64,32 --set trainer.batch_size=256 \
      --set trainer.seed="$seed" --set trainer.progress_interval_ms=0 \
      --set trainer.slots=1,2,3,4,5,6,7 --set "input.columns=$seq_cols" "${extra[@]}" \
      --train "$tmp/sq-train.tsv" --eval "$tmp/sq-eval.tsv" --epochs 2 --report "$tmp/r.json" \
      > /dev/null 2> "$tmp/r.err" || { cat "$tmp/r.err" >&2; echo "models_bench: sequence $fam seed $seed failed" >&2; exit 1; }
    python3 - "$tmp/r.json" "$fam" "$seed" <<'PY' | tee -a "$runs"
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"bench": "models", "dataset": "synthetic-sequence", "model": sys.argv[2],
                  "seed": int(sys.argv[3]), "examples": r["examples"], "eval_auc": r["eval_auc"],
                  "eval_logloss": r["eval_logloss"], "examples_per_s": r["examples_per_s"]},
                 separators=(",", ":")))
PY
  done
done

# summaries: per dataset and family, the AUC's mean and std, and its difference to deepfm's
# of the same seed
awk '
  function num(key,   v) { v = $0; if (!match(v, "\"" key "\":[-0-9.e+]+")) return ""; v = substr(v, RSTART, RLENGTH); sub(/^[^:]*:/, "", v); return v + 0 }
  function str(key,   v) { v = $0; match(v, "\"" key "\":\"[^\"]*\""); v = substr(v, RSTART, RLENGTH); sub(/^[^:]*:"/, "", v); sub(/"$/, "", v); return v }
  {
    ds = str("dataset"); m = str("model"); s = num("seed"); a = num("eval_auc")
    key = ds SUBSEP m
    if (!(key in n)) { order[++no] = key }
    n[key]++; sum[key] += a; sq[key] += a * a; auc[ds, m, s] = a; ll[key] += num("eval_logloss")
    seeds[ds, m] = seeds[ds, m] " " s
  }
  END {
    for (i = 1; i <= no; i++) {
      split(order[i], p, SUBSEP); ds = p[1]; m = p[2]; key = order[i]
      mean = sum[key] / n[key]; var = sq[key] / n[key] - mean * mean; if (var < 0) var = 0
      nd = 0; d = 0
      ns = split(seeds[ds, m], ss, " ")
      for (j = 1; j <= ns; j++) if ((ds, "deepfm", ss[j]) in auc) { d += auc[ds, m, ss[j]] - auc[ds, "deepfm", ss[j]]; nd++ }
      printf "{\"bench\":\"models\",\"summary\":true,\"dataset\":\"%s\",\"model\":\"%s\",\"seeds\":%d,\"eval_auc_mean\":%.4f,\"eval_auc_std\":%.4f,\"eval_logloss_mean\":%.4f,\"auc_vs_deepfm_mean\":%.4f}\n", ds, m, n[key], mean, sqrt(var), ll[key] / n[key], nd ? d / nd : 0
    }
  }' "$runs"
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "{\"bench\":\"models\",\"metric\":\"conditions\",\"value\":%.3f,\"unit\":\"s\",\"stage\":\"run\"}\n", b - a }'
