#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   1. installs the Debian packages (scripts/setup.sh, idempotent)
#   2. checks the format of our sources (.clang-format)
#   3. builds with -Werror and runs each benchmark in quick mode (a smoke test: figures are
#      printed, not judged)
#   4. builds the libFuzzer targets with clang and runs each for 5 s (scripts/fuzz.sh)
#   5. runs every test (ctest)
#   6. builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs every test
#   7. builds again with ThreadSanitizer and runs the concurrency-heavy tests
# and ends with one line "tests: N passed, M failed, K skipped" over the three builds.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
bash scripts/format.sh --check

bash scripts/build.sh release
echo "== benchmark smoke (quick mode) =="
build/release/bench/table_bench --quick --reps 1
build/release/bench/ps_bench --quick
build/release/bench/trainer_bench --quick
build/release/bench/movielens_bench --quick
build/release/bench/serving_bench --quick --shards 2
build/release/bench/fanout_bench --quick
build/release/bench/sweep_bench --quick
bash bench/many_trainers_bench.sh --quick
bash bench/models_bench.sh --quick
bash bench/cowclip_bench.sh --quick

# libFuzzer smoke (clang build in build/fuzz, 5 s per target: docs/fuzzing.md). It counts as
# one test in the tally below, through a ctest-like line of its own.
echo "== fuzzing (5 s per target) =="
fuzz_status=0
bash scripts/fuzz.sh --seconds 5 || fuzz_status=1

# ctest runs as many tests at a time as there are cores: each test waits for conditions,
# never for a fixed time, and every daemon it starts listens on a port the kernel chooses
jobs=$(nproc 2>/dev/null || echo 2)
log=$(mktemp)
# Cases that need ../shared/data skip when it is absent (a user's clone) and record a line
# here (tests/testutil_data.h, tests/e2e/lib.sh skip_case); the end of the run counts them.
export MT_SKIP_LOG
MT_SKIP_LOG=$(mktemp)
trap 'rm -f "$log" "$MT_SKIP_LOG"' EXIT
status=0
san_failed=0
if [ "$fuzz_status" -eq 0 ]; then
  echo "100% tests passed, 0 tests failed out of 1" >>"$log"
else
  echo "0% tests passed, 1 tests failed out of 1" >>"$log"
  status=1
fi
echo "== tests (release) =="
(cd build/release && ctest -j"$jobs" --output-on-failure --timeout 900) 2>&1 | tee -a "$log" || status=1

bash scripts/build.sh asan
# Every sanitizer report of every process (tests, the daemons they start, Criterion's
# forked cases) goes to a file of its own in $san_dir; scripts/sanitizer_reports.awk then
# judges them all. A leak does not change an exit status (LSan exitcode=0): Criterion's
# runner keeps 48 bytes until exit, which the awk script recognizes and nothing else.
san_dir=$(mktemp -d)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:log_path=$san_dir/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$san_dir/ubsan"
export LSAN_OPTIONS="print_suppressions=0:exitcode=0"
echo "== tests (ASan + UBSan) =="
asan_log=$(mktemp)
trap 'rm -rf "$log" "$asan_log" "$san_dir" "$MT_SKIP_LOG"' EXIT
if ! (cd build/asan && ctest -j"$jobs" --output-on-failure --timeout 1800 -V) > "$asan_log" 2>&1; then
  status=1
  echo "ASan run failed; the failed cases, then the end of its output:"
  grep -E "\[FAIL\]|\[----\].*(ssert|FAIL)|^[0-9]+: FAIL" "$asan_log" | head -40 || true
  tail -150 "$asan_log"
fi
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|Total Test time" "$asan_log" | tee -a "$log"
# Criterion runs each case in a child whose sanitizer reports do not fail the case: any
# report of ours anywhere in the output fails the suite (scripts/sanitizer_reports.awk).
shopt -s nullglob
san_files=("$asan_log" "$san_dir"/*)
shopt -u nullglob
if ! awk -f scripts/sanitizer_reports.awk "${san_files[@]}" > "$asan_log.reports"; then
  echo "sanitizer reports:"
  head -200 "$asan_log.reports"
  san_failed=1
  status=1
fi
rm -f "$asan_log.reports"
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS

# ThreadSanitizer on the concurrency-heavy tests (the "tsan" label: tests/CMakeLists.txt),
# over our Criterion-compatible runner (Criterion cannot run under TSan: tests/tsan/).
# Reports go to files of their own; any report not suppressed by tests/tsan.supp (each entry
# says why its race is benign) fails the suite, whatever the exit status said.
bash scripts/build.sh tsan
tsan_dir=$(mktemp -d)
tsan_log=$(mktemp)
trap 'rm -rf "$log" "$asan_log" "$san_dir" "$MT_SKIP_LOG" "$tsan_dir" "$tsan_log"' EXIT
export TSAN_OPTIONS="halt_on_error=0:history_size=7:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp:log_path=$tsan_dir/tsan"
echo "== tests (ThreadSanitizer) =="
if ! (cd build/tsan && ctest -j"$jobs" -L tsan --output-on-failure --timeout 1800) > "$tsan_log" 2>&1; then
  status=1
  echo "TSan run failed; the failed cases, then the end of its output:"
  grep -E "\[FAIL\]|\[----\]" build/tsan/Testing/Temporary/LastTest.log | head -40 || true
  tail -100 "$tsan_log"
fi
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|Total Test time" "$tsan_log" | tee -a "$log"
shopt -s nullglob
tsan_files=("$tsan_dir"/*)
shopt -u nullglob
if [ ${#tsan_files[@]} -gt 0 ] && grep -l "WARNING: ThreadSanitizer" "${tsan_files[@]}" > /dev/null; then
  echo "ThreadSanitizer reports:"
  grep -h -A40 "WARNING: ThreadSanitizer" "${tsan_files[@]}" | head -300
  san_failed=1
  status=1
fi
unset TSAN_OPTIONS

# ctest prints "NN% tests passed, F tests failed out of T" per build, and a test that exits
# with its SKIP_RETURN_CODE as "***Skipped" (counted among the passed in that line).
read -r passed failed < <(awk '/tests passed, .* tests failed out of/ {
    f += $4; t += $NF } END { printf "%d %d\n", t - f, f }' "$log")
skipped_tests=$(grep -c -E "Test +#[0-9]+: .*\*\*\*Skipped" "$log" || true)
passed=$((passed - skipped_tests))
echo "suite time: $(( $(date +%s) - start )) s"
failed=$((failed + san_failed))
skipped_cases=$(sort -u "$MT_SKIP_LOG" | wc -l)
if [ "$skipped_cases" -gt 0 ]; then
  echo "skipped for missing data (no ../shared/data beside the repository): $skipped_cases cases" \
       "($(wc -l < "$MT_SKIP_LOG") skips over both builds)"
  sort -u "$MT_SKIP_LOG" | sed 's/^/  skipped: /'
else
  echo "skipped for missing data: none (../shared/data present)"
fi
echo "tests: $passed passed, $failed failed, $skipped_tests skipped"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
