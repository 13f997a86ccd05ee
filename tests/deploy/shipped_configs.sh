#!/usr/bin/env bash
# The shipped configurations stay valid for the daemons that read them: deploy/monolith.conf
# and the Kubernetes ConfigMap's monolith.conf (deploy/k8s/configmap.yaml), each through the
# --check of monolith-ps, monolith-trainer (--online), monolith-serving and monolith-joiner;
# and the trainer Deployment's replica count agrees with the ConfigMap's mode (more than one
# trainer only with trainer.idempotent = true: cluster checkpoints take exactly one).
# usage: shipped_configs.sh SOURCE_DIR PS TRAINER SERVING JOINER
set -euo pipefail
src=$1 ps=$2 trainer=$3 serving=$4 joiner=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the ConfigMap's file: the block under "monolith.conf: |", its 4-space indent removed
awk '/^  monolith.conf: \|/ { on = 1; next } on && /^    / { print substr($0, 5); next }
     on && /^$/ { print ""; next } on { exit }' "$src/deploy/k8s/configmap.yaml" > "$tmp/k8s.conf"
[ -s "$tmp/k8s.conf" ] || { echo "FAIL: no monolith.conf in the ConfigMap" >&2; exit 1; }
fails=0
for conf in "$src/deploy/monolith.conf" "$tmp/k8s.conf"; do
  for cmd in "$ps --shard 0" "$trainer --online" "$serving" "$joiner"; do
    # shellcheck disable=SC2086 # cmd holds the binary and its flags
    if out=$($cmd --config "$conf" --check 2>&1); then
      echo "ok: ${cmd##*/} --check $(basename "$conf")"
    else
      echo "FAIL: ${cmd##*/} --check $(basename "$conf"): $out" >&2
      fails=$((fails + 1))
    fi
  done
done
replicas=$(sed -n 's/^  replicas: *\([0-9]*\).*/\1/p' "$src/deploy/k8s/trainer.yaml" | head -1)
idem=$(sed -n 's/^ *idempotent *= *\([a-z]*\).*/\1/p' "$tmp/k8s.conf" | head -1)
if [ "${replicas:-1}" -gt 1 ] && [ "$idem" != true ]; then
  echo "FAIL: trainer.yaml runs $replicas trainers, the ConfigMap's trainer is not idempotent" >&2
  fails=$((fails + 1))
fi
echo "trainer Deployment: $replicas replicas, trainer.idempotent = ${idem:-false}"
[ "$fails" -eq 0 ] || exit 1
