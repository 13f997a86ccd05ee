#!/usr/bin/env bash
# monolith-trainer end to end (batch mode), on the synthetic stream of `monolith gen`:
#  1. a local run learns (eval AUC well above chance), reports its figures as JSON, and skips
#     the bad lines it was given, logging each with its file and line number;
#  2. the same run against a monolith-ps shard started from the same config file (sparse
#     rows and dense parameters on the PS) reports exactly the same figures; so does the
#     dcnv2 model (model.type) with per-slot dims (trainer.slot_dims), which learns as
#     deepfm does; so does the multi-task mmoe on the stream with conversions (`monolith gen
#     --tasks 2`, input.task_labels), which reports an eval AUC per task; so does din on the
#     stream with the users' recent clicks (`monolith gen --sequence 10`, a multi-valued
#     column read as a sequence, looked up in the item slot's rows on the PS too);
#  2p. trainer.pipelined, locally and on the PS: every example and bad line as before, every
#     step but a pass's first overlapped with the previous one's apply, values one step stale
#     (an eval log loss of their own, the AUC above 0.6 all the same), and again the same
#     figures on the PS as locally;
#  3. real data from ../shared/data: MovieLens 100k with its side files (progressive AUC
#     above 0.75 over two epochs) and the Criteo sample (above 0.6 in one pass);
#  4. bad command lines and configurations exit 2 with a message naming the culprit, an
#     unreadable file exits 1.
# Needs MT_TRAINER_BIN, MT_PS_BIN, MT_CLI_BIN and MT_SOURCE_DIR.
set -euo pipefail
: "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_SOURCE_DIR:?}"
. "$(dirname "$0")/lib.sh"
e2e_init trainer-e2e

conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
small=(--set trainer.hidden=64,32 --set trainer.batch_size=500 --set trainer.progress_interval_ms=200
       --set trainer.auc_window=5000)
# one stream (one seed: one hidden world), split in time: the first 30,000 train, the last 10,000 eval
"$MT_CLI_BIN" gen --examples 40000 --seed 11 --users 3000 --items 1000 > "$tmp/all.tsv"
head -n 30001 "$tmp/all.tsv" > "$tmp/train.tsv"
{ head -n 1 "$tmp/all.tsv"; tail -n 10000 "$tmp/all.tsv"; } > "$tmp/eval.tsv"
# two bad lines: line 5 (a missing column) and line 9 (a label that is no number)
sed -i '5s/^.*$/1\t1700000000004\t17/; 9s/^[01]/x/' "$tmp/train.tsv"

# on_ps NAME TRAIN EVAL ARGS...: a monolith-ps shard started with ARGS (and small's), the
# same two-epoch batch run against it (report $tmp/NAME-ps.json, log $tmp/NAME-ps.err), the
# shard stopped after; same_on_ps NAME KEYS...: those figures of the local run's report
# ($tmp/NAME.json) are the PS run's
on_ps() {
  local name=$1 train=$2 eval=$3; shift 3
  "$MT_PS_BIN" --config "$conf" --listen 127.0.0.1:0 --port-file "$tmp/$name.port" "${small[@]}" "$@" \
    2> "$tmp/$name-shard.err" &
  pids+=($!)
  wait_until "$E2E_GUARD_S" test -s "$tmp/$name.port" ||
    { cat "$tmp/$name-shard.err" >&2; fail "$name: monolith-ps did not start"; }
  "$MT_TRAINER_BIN" --config "$conf" "${small[@]}" "$@" --set "cluster.ps=127.0.0.1:$(cat "$tmp/$name.port")" \
    --train "$train" --eval "$eval" --epochs 2 --report "$tmp/$name-ps.json" \
    > /dev/null 2> "$tmp/$name-ps.err" || { cat "$tmp/$name-ps.err" >&2; fail "$name: PS run"; }
  kill -TERM "${pids[0]}"; wait "${pids[0]}" || fail "$name: monolith-ps exit status"; pids=()
}
same_on_ps() {
  local name=$1 k; shift
  for k in "$@"; do
    [ "$(json "$tmp/$name.json" "$k")" = "$(json "$tmp/$name-ps.json" "$k")" ] \
      || fail "$name: $k differs: local $(cat "$tmp/$name.json") PS $(cat "$tmp/$name-ps.json")"
  done
}

echo "== 1. local batch run"
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" --train "$tmp/train.tsv" --eval "$tmp/eval.tsv" \
  --epochs 2 --report "$tmp/local.json" > "$tmp/local.out" 2> "$tmp/local.err" \
  || { cat "$tmp/local.err" >&2; fail "local run exited $?"; }
cat "$tmp/local.out"
grep -q "train.tsv:5: bad line skipped" "$tmp/local.err" || fail "line 5 not logged"
grep -q "train.tsv:9: bad line skipped" "$tmp/local.err" || fail "line 9 not logged"
grep -q "ex/s" "$tmp/local.err" || fail "no progress line"
[ "$(json "$tmp/local.json" examples)" = 29998 ] || fail "examples: $(cat "$tmp/local.json")"
[ "$(json "$tmp/local.json" bad_lines)" = 4 ] || fail "bad lines (2 per epoch): $(cat "$tmp/local.json")"
auc=$(json "$tmp/local.json" eval_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "eval AUC $auc is not above 0.6"

echo "== 2. the same run against a PS shard"
on_ps local "$tmp/train.tsv" "$tmp/eval.tsv"
grep -q "parameters on the PS" "$tmp/local-ps.err" || fail "did not use the PS"
same_on_ps local examples progressive_auc progressive_logloss eval_auc eval_logloss
[ "$(json "$tmp/local-ps.json" dense_syncs)" -gt 100 ] || fail "dense syncs: $(cat "$tmp/local-ps.json")"

echo "== 2p. pipelined steps (trainer.pipelined), the trainer's own table and the PS"
pipe=(--set trainer.pipelined=true)
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" "${pipe[@]}" --train "$tmp/train.tsv" \
  --eval "$tmp/eval.tsv" --epochs 2 --report "$tmp/pipe.json" > /dev/null 2> "$tmp/pipe.err" \
  || { cat "$tmp/pipe.err" >&2; fail "pipelined run exited $?"; }
on_ps pipe "$tmp/train.tsv" "$tmp/eval.tsv" "${pipe[@]}"
for r in pipe pipe-ps; do
  f="$tmp/$r.json"
  for k in examples bad_lines batches; do
    [ "$(json "$f" "$k")" = "$(json "$tmp/local.json" "$k")" ] || fail "$r: $k: $(cat "$f")"
  done
  [ "$(json "$f" pipelined_steps)" = $(( $(json "$f" batches) - 2 )) ] \
    || fail "$r: pipelined steps (all but each epoch's first): $(cat "$f")"
  [ "$(json "$f" eval_logloss)" != "$(json "$tmp/local.json" eval_logloss)" ] \
    || fail "$r: the unpipelined run's eval log loss: nothing was one step stale"
  awk -v a="$(json "$f" eval_auc)" 'BEGIN { exit !(a > 0.6) }' || fail "$r: eval AUC $(cat "$f")"
done
[ "$(json "$tmp/local.json" pipelined_steps)" = 0 ] || fail "unpipelined: $(cat "$tmp/local.json")"
# each lookup ordered on the pipeline thread (one step stale exactly): the PS run is the local one
same_on_ps pipe examples progressive_auc progressive_logloss eval_auc eval_logloss

echo "== 2b. dcnv2 (model.type): learns as deepfm does (eval AUC 0.6035 against 0.6031 here), and the same figures against a PS shard"
# with per-slot dims (trainer.slot_dims: slot 1 of dim 16, slot 3 of dim 4; the PS derives its
# table slots from the same keys)
dcn=(--set model.type=dcnv2 --set model.cross_layers=2 --set "trainer.slot_dims=1:16, 3:4")
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" "${dcn[@]}" --train "$tmp/train.tsv" \
  --eval "$tmp/eval.tsv" --epochs 2 --report "$tmp/dcn.json" > /dev/null 2> "$tmp/dcn.err" \
  || { cat "$tmp/dcn.err" >&2; fail "dcnv2 local run"; }
grep -q "model dcnv2" "$tmp/dcn.err" || fail "dcnv2: not the model trained: $(head -5 "$tmp/dcn.err")"
auc=$(json "$tmp/dcn.json" eval_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "dcnv2 eval AUC $auc is not above 0.6"
on_ps dcn "$tmp/train.tsv" "$tmp/eval.tsv" "${dcn[@]}"
same_on_ps dcn examples progressive_auc eval_auc eval_logloss

echo "== 2c. mmoe (model.type): two tasks (click, conversion) from two label columns, an eval AUC each, and the same figures against a PS shard"
"$MT_CLI_BIN" gen --examples 40000 --tasks 2 --seed 11 --users 3000 --items 1000 > "$tmp/all2.tsv"
head -n 30001 "$tmp/all2.tsv" > "$tmp/train2.tsv"
{ head -n 1 "$tmp/all2.tsv"; tail -n 10000 "$tmp/all2.tsv"; } > "$tmp/eval2.tsv"
mmoe=(--set model.type=mmoe --set model.experts=2 --set model.expert_width=32
      --set input.task_labels=conversion)
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" "${mmoe[@]}" --train "$tmp/train2.tsv" \
  --eval "$tmp/eval2.tsv" --epochs 2 --report "$tmp/mmoe.json" > "$tmp/mmoe.out" 2> "$tmp/mmoe.err" \
  || { cat "$tmp/mmoe.err" >&2; fail "mmoe local run"; }
grep -q "model mmoe" "$tmp/mmoe.err" || fail "mmoe: not the model trained: $(head -5 "$tmp/mmoe.err")"
grep -q "^task 1 progressive AUC" "$tmp/mmoe.out" || fail "mmoe: no task 1 line: $(cat "$tmp/mmoe.out")"
[ "$(json "$tmp/mmoe.json" tasks)" = 2 ] || fail "mmoe tasks: $(cat "$tmp/mmoe.json")"
python3 - "$tmp/mmoe.json" <<'PY' || fail "mmoe per-task eval AUC: $(cat "$tmp/mmoe.json")"
import json, sys
r = json.load(open(sys.argv[1]))
aucs = r["task_eval_auc"]
print("mmoe eval AUC per task:", aucs)
assert len(aucs) == 2 and aucs[0] == r["eval_auc"] and all(a > 0.55 for a in aucs)
PY
on_ps mmoe "$tmp/train2.tsv" "$tmp/eval2.tsv" "${mmoe[@]}"
python3 - "$tmp/mmoe.json" "$tmp/mmoe-ps.json" <<'PY' || fail "mmoe: local and PS differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for k in ("examples", "progressive_auc", "eval_auc", "eval_logloss", "task_eval_auc", "task_progressive_auc"):
    assert a[k] == b[k], (k, a[k], b[k])
PY
echo "== 2d. din (model.type): target attention over the users' recent clicks, and the same figures against a PS shard"
"$MT_CLI_BIN" gen --examples 40000 --sequence 10 --seed 11 --users 3000 --items 1000 > "$tmp/all3.tsv"
head -n 30001 "$tmp/all3.tsv" > "$tmp/train3.tsv"
{ head -n 1 "$tmp/all3.tsv"; tail -n 10000 "$tmp/all3.tsv"; } > "$tmp/eval3.tsv"
din=(--set model.type=din --set trainer.slots=1,2,3,4,5,6,7 --set model.sequence_slot=7
     --set model.sequence_query=2 --set model.sequence_length=10
     --set "input.columns=user:1, item:2, segment:3, category:4, hour:5, tags:6:int:multi, sequence:7:int:multi")
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" "${din[@]}" --train "$tmp/train3.tsv" \
  --eval "$tmp/eval3.tsv" --epochs 2 --report "$tmp/din.json" > /dev/null 2> "$tmp/din.err" \
  || { cat "$tmp/din.err" >&2; fail "din local run"; }
grep -q "model din" "$tmp/din.err" || fail "din: not the model trained: $(head -5 "$tmp/din.err")"
auc=$(json "$tmp/din.json" eval_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "din eval AUC $auc is not above 0.6"
on_ps din "$tmp/train3.tsv" "$tmp/eval3.tsv" "${din[@]}"
same_on_ps din examples progressive_auc eval_auc eval_logloss
# one label per task: a one-label input for the two-task model, and the reverse
expect_rc() { # expect_rc STATUS PATTERN ARGS...
  local want=$1 pat=$2; shift 2
  set +e; "$MT_TRAINER_BIN" "$@" > /dev/null 2> "$tmp/bad.err"; local got=$?; set -e
  [ "$got" = "$want" ] || fail "$* exited $got, expected $want: $(cat "$tmp/bad.err")"
  grep -q -- "$pat" "$tmp/bad.err" || fail "$*: no '$pat' in: $(cat "$tmp/bad.err")"
}
expect_rc 2 "gives 1 label per example" --config "$conf" --set model.type=mmoe --train "$tmp/train.tsv"
expect_rc 2 "gives 2 labels per example" --config "$conf" --set input.task_labels=conversion --train "$tmp/train2.tsv"
expect_rc 2 "model.task_weights" --config "$conf" --set model.type=mmoe --set model.task_weights=1 --check
# din: a sequence slot that is not the model's, or mean-pooled
expect_rc 2 "model.sequence_slot = 9" --config "$conf" "${din[@]}" --set model.sequence_slot=9 --check
expect_rc 2 "din's sequence slot" --config "$conf" "${din[@]}" --set trainer.mean_slots=7 --check

echo "== 3. real data (../shared/data): MovieLens 100k with side features, Criteo sample"
data=$(shared_data)
if [ ! -f "$data/movielens-100k/u.data" ] || [ ! -f "$data/criteo-kaggle-sample/train_head10k.txt" ]; then
  # the project runs without the real data (a user's clone has none); CI has it
  skip_case "trainer_daemon: real data (MovieLens 100k, Criteo)" "$data/movielens-100k, $data/criteo-kaggle-sample"
else
"$MT_TRAINER_BIN" --config "$conf" --set input.format=movielens-100k --set trainer.slots= \
  --set "input.users_file=$data/movielens-100k/u.user" --set "input.items_file=$data/movielens-100k/u.item" \
  --set trainer.hidden=64,32 --set trainer.batch_size=256 --train "$data/movielens-100k/u.data" \
  --epochs 2 --report "$tmp/ml.json" > /dev/null 2> "$tmp/ml.err" || { cat "$tmp/ml.err" >&2; fail "movielens"; }
[ "$(json "$tmp/ml.json" examples)" = 100000 ] || fail "movielens: $(cat "$tmp/ml.json")"
auc=$(json "$tmp/ml.json" progressive_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.75) }' || fail "movielens progressive AUC $auc"
"$MT_TRAINER_BIN" --config "$conf" --set input.format=criteo --set trainer.slots= \
  --set trainer.hidden=64,32 --set trainer.batch_size=256 \
  --train "$data/criteo-kaggle-sample/train_head10k.txt" --report "$tmp/cr.json" \
  > /dev/null 2> "$tmp/cr.err" || { cat "$tmp/cr.err" >&2; fail "criteo"; }
[ "$(json "$tmp/cr.json" examples)" = 10000 ] || fail "criteo: $(cat "$tmp/cr.json")"
auc=$(json "$tmp/cr.json" progressive_auc)
awk -v a="$auc" 'BEGIN { exit !(a > 0.6) }' || fail "criteo progressive AUC $auc"
fi

echo "== 4. bad input"
expect() { # expect STATUS PATTERN ARGS...
  local want=$1 pat=$2; shift 2
  set +e; "$MT_TRAINER_BIN" "$@" > /dev/null 2> "$tmp/bad.err"; local got=$?; set -e
  [ "$got" = "$want" ] || fail "$* exited $got, expected $want: $(cat "$tmp/bad.err")"
  grep -q -- "$pat" "$tmp/bad.err" || fail "$*: no '$pat' in: $(cat "$tmp/bad.err")"
}
expect 2 "trainer.dim" --config "$conf" --set trainer.dim=0 --check
expect 2 "input.columns" --config "$conf" --set input.columns=user:99999 --train "$tmp/train.tsv"
expect 2 "unknown option" --config "$conf" --bogus 1
expect 2 "either --train" --config "$conf"
expect 2 "trainer.hidden" --config "$conf" --set trainer.hidden=64,x --train "$tmp/train.tsv"
expect 2 "model.type" --config "$conf" --set model.type=dcn --check
expect 2 "99 is not one of the model's slots" --config "$conf" --set trainer.slot_hash_buckets=99:10 --check
expect 2 "deepfm's FM term needs one dim" --config "$conf" --set trainer.slot_dims=2:4 --check
expect 2 "cross_rank" --config "$conf" --set model.type=dcnv2 --set model.cross_rank=100000 --check
expect 2 "slots" --config "$conf" --set trainer.slots=1,2 --train "$tmp/train.tsv"
expect 1 "No such file" --config "$conf" --train "$tmp/missing.tsv"
printf '[trainer]\nslots = 1\nbogus = 3\n' > "$tmp/bad.conf"
expect 2 "bogus" --config "$tmp/bad.conf" --check
# many trainers (trainer.idempotent) need the PS, dense pushes every step, no checkpoints
expect 2 "trainer.idempotent needs" --config "$conf" --set trainer.idempotent=true --check
expect 2 "trainer.idempotent needs" --config "$conf" --set trainer.idempotent=true \
  --set cluster.ps=127.0.0.1:1 --set trainer.dense_sync_batches=10 --check
expect 2 "trainer.idempotent needs" --config "$conf" --set trainer.idempotent=true \
  --set cluster.ps=127.0.0.1:1 --set trainer.dense_sync_batches=1 \
  --set trainer.checkpoint_interval_s=5 --online
# online, pipelined steps need the PS (covered steps pipeline too: many_trainers_e2e.sh)
expect 2 "trainer.pipelined needs" --config "$conf" --set trainer.pipelined=true --online
echo "trainer daemon: all good"
