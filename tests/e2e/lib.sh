# lib.sh - what the end-to-end scripts of tests/e2e/ share. Source it right after
# `set -euo pipefail`:   . "$(dirname "$0")/lib.sh"; e2e_init NAME
#
#   e2e_init NAME        $tmp: a new temporary directory (/tmp/mt-NAME-XXXXXX), removed at exit
#                        unless MT_E2E_KEEP is set; pids: the processes the script started
#                        (pids+=($!)), killed at exit with signal $E2E_KILL (default KILL;
#                        TERM lets them exit cleanly, KILL after 60 s) and waited for
#   fail MSG...          prints FAIL: MSG, the last lines of every $tmp/*.err and of the files
#                        in E2E_LOGS, and the sanitizer reports in them; exits 1
#   sanitizer_reports    prints the ASan / LSan / UBSan reports of $tmp/*.err on stderr
#   say MSG...           MSG after the seconds since e2e_init
#   jnum TEXT KEY        the first number after "KEY": in a JSON text
#   json FILE KEY        the same, in a file
#   need_kcat            fails unless kcat is installed
#   wait_port_file F     waits for the file F to be written (a daemon's port), up to
#                        E2E_GUARD_S s
#   wait_until T CMD...  waits until CMD succeeds (polled every 0.1 s), up to T s; returns 1
#                        after T s
#   start_kafka TOPICS   starts monolith-kafka-dev ($MT_KAFKA_BIN) with TOPICS (name:parts,...),
#                        logs in $tmp/kafka.err; sets bs to its bootstrap address
#   metric PORT NAME     the value of the first sample of NAME at http://127.0.0.1:PORT/metrics
#   expect_in_topic N    fails unless the examples topic holds exactly N messages (a producer
#                        retry could have written one twice); sets in_topic
#   shared_data          the real datasets' folder: $MT_SHARED_DATA, else ../shared/data
#                        beside the repository ($MT_SOURCE_DIR or $MT_SHARED_DATA_BUILD)
#   skip_case NAME PATH  a case that needs PATH of the shared data is not run: says so and
#                        appends "NAME: PATH missing" to $MT_SKIP_LOG (scripts/test.sh counts)
#   expect_exact N T     exactly-once, counted: waits up to T s until PS shards 0 and 1 each
#                        reflect N examples (the script's `applied I`; its `e2e_check`, if
#                        defined, runs each round) and the script's `e2e_settled` succeeds
#                        (required: a condition after which nothing more can be applied, e.g.
#                        the trainer checkpointed N examples on both shards; no fixed pause
#                        for a late duplicate), or until a shard reflects more than N; then
#                        fails unless both reflect exactly N; sets a0 and a1
#
# Deadlines are hang guards, never what a test measures: generous (E2E_GUARD_S, default
# 300 s), since a loaded ASan machine is 5-10 times slower; a passing run never waits them.

E2E_KILL=${E2E_KILL:-KILL}
E2E_GUARD_S=${E2E_GUARD_S:-300}

shared_data() {
  if [ -n "${MT_SHARED_DATA:-}" ]; then echo "$MT_SHARED_DATA"
  elif [ -n "${MT_SHARED_DATA_BUILD:-}" ]; then echo "$MT_SHARED_DATA_BUILD"
  else echo "${MT_SOURCE_DIR:?}/../shared/data"; fi
}

skip_case() {
  echo "SKIPPED: $1: $2 missing (a clone without ../shared/data)"
  if [ -n "${MT_SKIP_LOG:-}" ]; then echo "$1: $2 missing" >> "$MT_SKIP_LOG"; fi
}
E2E_LOGS=()
pids=()

e2e_init() {
  tmp=$(mktemp -d "/tmp/mt-$1-XXXXXX")
  t0=$(date +%s.%N)
  trap e2e_cleanup EXIT
}

# 1 while process $1 runs (exited but not yet waited for: not running)
e2e_running() {
  local st=""
  [ -r "/proc/$1/stat" ] || return 1
  read -r _ _ st _ < "/proc/$1/stat" 2> /dev/null || return 1
  [ "$st" != Z ]
}

e2e_cleanup() {
  local p alive
  for p in "${pids[@]}"; do kill -s "$E2E_KILL" "$p" 2>/dev/null || true; done
  if [ "$E2E_KILL" != KILL ]; then # a clean exit gets 60 s, then KILL: never hang here
    for _ in $(seq 600); do
      alive=0
      for p in "${pids[@]}"; do e2e_running "$p" && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.1
    done
    for p in "${pids[@]}"; do e2e_running "$p" && kill -9 "$p" 2>/dev/null; done
  fi
  wait 2>/dev/null || true
  if [ -n "${MT_E2E_KEEP:-}" ]; then echo "kept $tmp" >&2; return; fi
  rm -rf "$tmp"
}

sanitizer_reports() {
  cat "$tmp"/*.err 2>/dev/null |
    grep -A30 -E "ERROR: (Address|Leak)Sanitizer|runtime error:|(Direct|Indirect) leak of" >&2 || true
}

fail() {
  echo "FAIL: $*" >&2
  local f
  for f in "$tmp"/*.err "${E2E_LOGS[@]}"; do
    [ -e "$f" ] || continue
    echo "--- $f" >&2
    tail -25 "$f" >&2
  done
  sanitizer_reports
  exit 1
}

elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "[$(elapsed) s] $*"; }
jnum() { sed -n "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/p" <<< "$1" | head -1; }
json() { sed -n "s/.*\"$2\": *\([-0-9.e+]*\).*/\1/p" "$1" | head -1; }

need_kcat() {
  command -v kcat > /dev/null || { echo "FAIL: kcat is missing (apt-get install kcat)" >&2; exit 1; }
}

wait_until() {
  local end=$(( $(date +%s) + $1 ))
  shift
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

wait_port_file() {
  wait_until "$E2E_GUARD_S" test -s "$1" || fail "no $1 in $E2E_GUARD_S s"
}

start_kafka() {
  "$MT_KAFKA_BIN" --topics "$1" --bootstrap-file "$tmp/bootstrap" > /dev/null 2> "$tmp/kafka.err" &
  pids+=($!)
  wait_port_file "$tmp/bootstrap"
  bs=$(cat "$tmp/bootstrap")
}

# The start of a many-trainers test (many_trainers_e2e.sh, many_trainers_alo_e2e.sh): N and
# RATE from the environment (MT_MANY_EXAMPLES, MT_MANY_RATE), the tmp dir, monolith-kafka-dev
# with examples:6, the shared config in conf and the model flags in model.
many_init() { # many_init NAME
  : "${MT_TRAINER_BIN:?}" "${MT_PS_BIN:?}" "${MT_CLI_BIN:?}" "${MT_KAFKA_BIN:?}" "${MT_SOURCE_DIR:?}"
  need_kcat
  N=${MT_MANY_EXAMPLES:-24000}
  RATE=${MT_MANY_RATE:-2000}
  GARBAGE=3
  e2e_init "$1"
  start_kafka examples:6,features:4
  conf="$MT_SOURCE_DIR/deploy/trainer.example.conf"
  model=(--set trainer.hidden=32,16 --set trainer.dim=8 --set kafka.session_timeout_ms=6000
         --set "kafka.bootstrap=$bs")
}

# Two monolith-ps shards on kernel-chosen ports with the script's conf and model flags:
# their ports in port[0..1], their pids in ps_pids, "host:port,host:port" in cluster.
start_two_shards() {
  local i
  declare -ga port=() ps_pids=()
  for i in 0 1; do
    "$MT_PS_BIN" --config "$conf" "${model[@]}" --shard "$i" --num-shards 2 \
      --listen 127.0.0.1:0 --port-file "$tmp/ps$i.port" 2>> "$tmp/ps$i.err" &
    pids+=($!) ps_pids+=($!)
    wait_port_file "$tmp/ps$i.port"
    port[$i]=$(cat "$tmp/ps$i.port")
  done
  cluster="127.0.0.1:${port[0]},127.0.0.1:${port[1]}"
}

# Starts `monolith gen` producing COUNT (default N) examples at RATE/s into examples
# (gen_pid), then writes GARBAGE bad messages with kcat. A second call (with SEED, and no
# garbage) produces more: many_produced then expects N in all.
many_produce() { # many_produce [COUNT [SEED]]
  local count=${1:-$N} seed=${2:-21}
  say "== producing $count examples at $RATE/s${2:+ (seed $seed)}"
  "$MT_CLI_BIN" gen --examples "$count" --seed "$seed" --users 2000 --items 500 --kafka "$bs" \
    --topic examples --rate "$RATE" > /dev/null 2> "$tmp/gen$seed.err" &
  gen_pid=$! gen_count=$count gen_seed=$seed
  pids+=($!)
  [ -n "${2:-}" ] && return
  printf 'not an example\n\xff\xfe garbage\n{"json": 1}\n' |
    kcat -b "$bs" -P -t examples 2> "$tmp/kcat.err" || fail "kcat: $(cat "$tmp/kcat.err")"
}

# Waits for the producer of the last many_produce and for the topic to hold all N examples.
many_produced() {
  wait "$gen_pid" || fail "the producer failed"
  grep -q " $gen_count examples delivered" "$tmp/gen$gen_seed.err" ||
    fail "producer: $(cat "$tmp/gen$gen_seed.err")"
  expect_in_topic "$((N + GARBAGE))"
}

metric() {
  local body
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 0
  printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3
  body=$(cat <&3)
  exec 3<&-
  awk -v n="$2" '$1 == n || index($1, n "{") == 1 { print $2; exit }' <<< "$body"
}

# examples_applied of PS shard I (port[I]), or nothing while it does not answer; a script may
# define its own before using the helpers below
applied() {
  local s
  s=$("$MT_CLI_BIN" stats --addr "127.0.0.1:${port[$1]}" 2> /dev/null) || return 0
  jnum "$s" examples_applied
}
# waits until shard 0 reflects at least $1 examples (a hang guard of $2 s, E2E_GUARD_S by
# default), calling the script's e2e_check (if any) on every round
wait_applied() {
  local end=$(( $(date +%s) + ${2:-$E2E_GUARD_S} ))
  while [ "$(date +%s)" -lt "$end" ]; do
    local a; a=$(applied 0)
    [ -n "$a" ] && [ "$a" -ge "$1" ] && return 0
    if declare -F e2e_check > /dev/null; then e2e_check; fi
    sleep 0.2
  done
  fail "shard 0 did not reach $1 examples in ${2:-$E2E_GUARD_S} s (at: $(applied 0))"
}
# the metrics port a daemon logged in file $1 ("metrics on port N"), or nothing
metrics_port() { sed -n 's/.*metrics on port \([0-9]*\).*/\1/p' "$1" | tail -1; }

expect_in_topic() {
  in_topic=$(kcat -b "$bs" -C -t examples -e -q -f '%p %o\n' 2> /dev/null | wc -l)
  say "produced $1, in the topic $in_topic"
  [ "$in_topic" -eq "$1" ] || fail "the topic holds $in_topic messages, $1 were produced"
}

expect_exact() {
  local end=$(( $(date +%s) + $2 ))
  declare -F e2e_settled > /dev/null || fail "expect_exact: the script defines no e2e_settled"
  say "== waiting until both shards reflect $1 examples and nothing more can come"
  while :; do
    a0=$(applied 0) a1=$(applied 1)
    [ "${a0:-0}" -ge "$1" ] && [ "${a1:-0}" -ge "$1" ] && e2e_settled && break
    [ "${a0:-0}" -gt "$1" ] || [ "${a1:-0}" -gt "$1" ] && break # judged below
    [ "$(date +%s)" -lt "$end" ] ||
      fail "shards at ${a0:-?} / ${a1:-?} of $1 examples, not settled in $2 s"
    if declare -F e2e_check > /dev/null; then e2e_check; fi
    sleep 0.3
  done
  a0=$(applied 0) a1=$(applied 1)
  say "shard 0: $a0, shard 1: $a1 examples applied (of $1)"
  [ "$a0" -eq "$1" ] || fail "shard 0 reflects $a0 examples, not $1 (lost or applied twice)"
  [ "$a1" -eq "$1" ] || fail "shard 1 reflects $a1 examples, not $1 (lost or applied twice)"
}
