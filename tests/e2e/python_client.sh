#!/usr/bin/env bash
# The Python example client (clients/python/monolith_client.py) against a local cluster: a
# monolith-ps shard trained by monolith-trainer (batch, 6,000 examples of `monolith gen`)
# and a monolith-serving replica following it. With the stubs the build generated from
# proto/ (protoc + gRPC's Python plugin) over Debian's python3-grpcio:
#  1. Predict from Python gives the scores `monolith predict` (C, protobuf-c) gives, within
#     1e-6, for the same user and candidates; both in (0, 1);
#  2. Lookup from Python (one call per slot) gives, once the replica has synced, the PS's
#     own embeddings (`monolith lookup --ps`) within 1e-6, found and missing alike (an
#     rows (embedding and first-order weight) of trained ids, and an id never seen);
#  3. errors as users see them: a Lookup of a slot the model lacks and a request id over 256
#     bytes are INVALID_ARGUMENT (exit 1), a bad fid or candidate exit 2, a dead address
#     UNAVAILABLE (exit 1).
# Needs MT_PS_BIN, MT_TRAINER_BIN, MT_SERVING_BIN, MT_CLI_BIN, MT_PY_STUBS, MT_SOURCE_DIR.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
e2e_init python-client
E2E_KILL=TERM

py=/usr/bin/python3 # Debian's, with python3-grpcio (another python3 on PATH may lack it)
client="$MT_SOURCE_DIR/clients/python/monolith_client.py"
[ -x "$py" ] || fail "$py missing: bash scripts/setup.sh installs python3-grpcio"
"$py" -c "import grpc, google.protobuf" 2> "$tmp/py.err" ||
  fail "python3-grpcio / python3-protobuf missing (bash scripts/setup.sh): $(cat "$tmp/py.err")"
[ -f "$MT_PY_STUBS/monolith/v1/serving_pb2_grpc.py" ] ||
  fail "no generated stubs in $MT_PY_STUBS (protoc and grpc_python_plugin: bash scripts/setup.sh)"
pyc() { "$py" "$client" --stubs "$MT_PY_STUBS" "$@"; }

conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
small=(--set trainer.hidden=32,16 --set trainer.batch_size=200 --set trainer.progress_interval_ms=0)
"$MT_CLI_BIN" gen --examples 6000 --seed 5 --users 300 --items 100 > "$tmp/train.tsv"
"$MT_PS_BIN" --config "$conf" "${small[@]}" --listen 127.0.0.1:0 --port-file "$tmp/ps.port" \
  --set ps.expire_interval_ms=0 2> "$tmp/ps.err" &
pids+=($!)
wait_port_file "$tmp/ps.port"
ps="127.0.0.1:$(cat "$tmp/ps.port")"
"$MT_TRAINER_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" --train "$tmp/train.tsv" \
  > "$tmp/tr.out" 2> "$tmp/tr.err" || fail "the trainer exited $?"
"$MT_SERVING_BIN" --config "$conf" "${small[@]}" --set "cluster.ps=$ps" --listen 127.0.0.1:0 \
  --port-file "$tmp/sv.port" --set serving.sync_interval_ms=200 \
  --set serving.dense_sync_interval_ms=200 --set serving.log_sample_rate=0 2> "$tmp/sv.err" &
pids+=($!)
wait_port_file "$tmp/sv.port"
sv="127.0.0.1:$(cat "$tmp/sv.port")"
serving() { "$MT_CLI_BIN" health --addr "$sv" > /dev/null 2>&1; }
wait_until "$E2E_GUARD_S" serving || fail "the replica never became SERVING"
say "PS $ps trained; serving $sv"

say "== 1. Predict: Python and the C tool"
args=(predict --user 1:17,3:2,5:9 --candidate 5=2:5,4:3,6:1 --candidate 6=2:6,4:1
      --candidate 77=2:77,4:2,6:2,6:3 --request-id py-e2e)
"$MT_CLI_BIN" "${args[@]}" --addr "$sv" > "$tmp/c.json" || fail "monolith predict exited $?"
pyc --addr "$sv" "${args[@]}" > "$tmp/py.json" || fail "the Python client exited $?"
say "C: $(cat "$tmp/c.json")"
say "Python: $(cat "$tmp/py.json")"
"$py" - "$tmp/c.json" "$tmp/py.json" <<'EOF' || fail "the scores differ"
import json, sys
c, p = (json.load(open(f)) for f in sys.argv[1:3])
assert len(c["scores"]) == len(p["scores"]) == 3, (c, p)
for a, b in zip(c["scores"], p["scores"]):
    assert 0 < a < 1 and abs(a - b) <= 1e-6, (a, b)
assert p["dense_version"] > 0, p
EOF

say "== 2. Lookup: Python through the replica, the C tool on the PS"
fids=(1:17 2:5 4:3 6:1 3:2 2:999999)
lookup_same() {
  "$MT_CLI_BIN" lookup --ps "$ps" "${fids[@]}" > "$tmp/ps.lk" 2> /dev/null || return 1
  pyc --addr "$sv" lookup "${fids[@]}" > "$tmp/py.lk" 2> "$tmp/py.lk.err" || return 1
  "$py" - "$tmp/ps.lk" "$tmp/py.lk" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 6, (a, b)
for x, y in zip(a, b):
    assert x["fid"] == y["fid"] and x["found"] == y["found"], (x, y)
    assert len(x["embedding"]) == len(y["embedding"]), (x, y)
    assert all(abs(u - v) <= 1e-6 for u, v in zip(x["embedding"], y["embedding"])), (x, y)
assert not b[-1]["found"] and sum(x["found"] for x in b) >= 4, b
EOF
}
wait_until "$E2E_GUARD_S" lookup_same ||
  fail "the replica's embeddings never matched the PS's: $(cat "$tmp/ps.lk" "$tmp/py.lk" "$tmp/py.lk.err")"
head -2 "$tmp/py.lk"

say "== 3. errors"
set +e
pyc --addr "$sv" predict --user 1:17 --candidate 5= > /dev/null 2> "$tmp/e1"; r1=$?
pyc --addr "$sv" predict --user 1:x --candidate 5=2:5 > /dev/null 2> "$tmp/e2"; r2=$?
pyc --addr 127.0.0.1:1 --timeout-s 5 lookup 1:17 > /dev/null 2> "$tmp/e3"; r3=$?
pyc --addr "$sv" lookup 999:1 > /dev/null 2> "$tmp/e5"; r5=$?
"$py" - "$MT_PY_STUBS" "$sv" > /dev/null 2> "$tmp/e4" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import grpc
from monolith.v1 import serving_pb2, serving_pb2_grpc
stub = serving_pb2_grpc.ServingStub(grpc.insecure_channel(sys.argv[2]))
try:
    stub.Predict(serving_pb2.PredictRequest(request_id="x" * 300,
                                            candidates=[serving_pb2.Candidate(item_id=1)]),
                 timeout=10)
except grpc.RpcError as e:
    print(e.code().name, file=sys.stderr)
    sys.exit(1)
EOF
r4=$?
set -e
[ "$r1" -eq 2 ] || fail "an empty candidate: exit $r1: $(cat "$tmp/e1")"
[ "$r2" -eq 2 ] || fail "a bad fid: exit $r2: $(cat "$tmp/e2")"
[ "$r3" -eq 1 ] && grep -q UNAVAILABLE "$tmp/e3" || fail "a dead address: exit $r3: $(cat "$tmp/e3")"
[ "$r4" -eq 1 ] && grep -q INVALID_ARGUMENT "$tmp/e4" ||
  fail "a long request id: exit $r4: $(cat "$tmp/e4")"
[ "$r5" -eq 1 ] && grep -q INVALID_ARGUMENT "$tmp/e5" ||
  fail "a slot the model lacks: exit $r5: $(cat "$tmp/e5")"
say "python client: all good"
