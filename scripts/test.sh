#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   1. installs the Debian packages (scripts/setup.sh, idempotent)
#   2. checks the format of our sources (.clang-format)
#   3. builds with -Werror and runs every test (ctest)
#   4. builds again with AddressSanitizer + UndefinedBehaviorSanitizer and runs every test
#   5. runs each benchmark in its quick mode (a smoke test: figures are printed, not judged)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
bash scripts/format.sh --check

bash scripts/build.sh release
(cd build/release && ctest --output-on-failure --timeout 900)

bash scripts/build.sh asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build/asan && ctest --output-on-failure --timeout 1800)

echo "== benchmark smoke (quick mode) =="
build/release/bench/table_bench --quick

echo "test suite: all green in $(( $(date +%s) - start )) s"
