#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (build/fuzz: ASan + UBSan + libFuzzer),
# runs every fuzz/regressions/<target>/ input once (must pass), then fuzzes each target for
# N seconds from a temporary copy of its seed corpus fuzz/corpus/<target>/ (the repository is
# not modified), two targets at a time. Fails on any crash, sanitizer report, leak or timeout;
# a crashing input is kept in build/fuzz/crashes/<target>/. docs/fuzzing.md.
#   bash scripts/fuzz.sh [--seconds N] [--jobs J] [target...]   (default 10 s, J = 2, all)
# Installs nothing: clang comes with scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=10
jobs=2
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n 2,8p "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
command -v clang >/dev/null || { echo "fuzz: clang not found (bash scripts/setup.sh)"; exit 1; }

start=$(date +%s)
CC=clang cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMT_BUILD_FUZZ=ON \
  -DMT_SANITIZE=ON -DMT_BUILD_TESTS=OFF -DMT_BUILD_BENCH=OFF >build/fuzz-configure.log 2>&1 ||
  { cat build/fuzz-configure.log; exit 1; }
if ! cmake --build build/fuzz -j"$(nproc)" --target fuzz_all >build/fuzz-build.log 2>&1; then
  grep -vE "^\[ *[0-9]+%\]" build/fuzz-build.log | tail -60
  echo "fuzz: build failed"
  exit 1
fi
bindir=build/fuzz/fuzz
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd "$bindir" && ls fuzz_* 2>/dev/null | grep -E '^fuzz_[a-z_]+$' | grep -vx fuzz_gen_corpus | sed 's/^fuzz_//' | sort)
fi
echo "fuzz: built ${#targets[@]} targets in $(( $(date +%s) - start )) s"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
crashdir=build/fuzz/crashes
fail=0

# Regressions: inputs that once crashed; each must now run clean. Files under open/ are
# known, unfixed bugs of a module: run and reported, not failing the run.
for t in "${targets[@]}"; do
  for f in fuzz/regressions/"$t"/*; do
    [ -f "$f" ] || continue
    if "$bindir/fuzz_$t" "$f" >"$work/reg.log" 2>&1; then
      echo "regression $t/$(basename "$f"): ok"
    else
      echo "regression $t/$(basename "$f"): FAILED"; tail -30 "$work/reg.log"; fail=1
    fi
  done
  for f in fuzz/regressions/"$t"/open/*; do
    [ -f "$f" ] || continue
    if MT_FUZZ_OPEN_BUGS=1 "$bindir/fuzz_$t" "$f" >/dev/null 2>&1; then
      echo "regression $t/open/$(basename "$f"): passes now: move it out of open/"
    else
      echo "regression $t/open/$(basename "$f"): still failing (open bug, not counted)"
    fi
  done
done

run_one() { # target: fuzz it, write one summary line to $work/<t>.line, exit 1 on a finding
  local t="$1" corpus="$work/corpus/$1" out="$crashdir/$1"
  mkdir -p "$corpus" "$out"
  [ -d "fuzz/corpus/$t" ] && cp -r "fuzz/corpus/$t/." "$corpus/"
  local rc=0
  "$bindir/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$out/" "$corpus" >"$work/$t.log" 2>&1 || rc=$?
  local execs ft cov
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/$t.log")
  ft=$(grep -oE 'ft: [0-9]+' "$work/$t.log" | tail -1 | cut -d' ' -f2)
  cov=$(grep -oE 'cov: [0-9]+' "$work/$t.log" | tail -1 | cut -d' ' -f2)
  if [ "$rc" -eq 0 ]; then
    printf '%-24s ok      %10s execs  cov %5s  features %6s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" >"$work/$t.line"
  else
    { printf '%-24s CRASHED (exit %d): input in %s/\n' "$t" "$rc" "$out"
      # the sanitizers' and libFuzzer's lines, not the target's own ERROR log lines
      grep -E "==[0-9]+== ?ERROR|SUMMARY|runtime error|#[0-9]+ 0x|fuzz_[a-z_]+: " "$work/$t.log" |
        head -25; } >"$work/$t.line"
    return 1
  fi
}
export -f run_one
export work bindir seconds crashdir
echo "== fuzzing ${#targets[@]} targets, ${seconds} s each, $jobs at a time =="
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} || fail=1
for t in "${targets[@]}"; do cat "$work/$t.line" 2>/dev/null || { echo "$t: no result"; fail=1; }; done
echo "fuzz: $(( $(date +%s) - start )) s, $([ $fail -eq 0 ] && echo passed || echo FAILED)"
exit $fail
