#!/usr/bin/env bash
# scripts/format.sh          reformats our C sources in place with the root .clang-format
# scripts/format.sh --check  fails (exit 1) listing files that are not formatted
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build/*')
[ ${#files[@]} -gt 0 ] || exit 0
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then echo "not formatted: $f"; bad=1; fi
  done
  [ $bad -eq 0 ] && echo "format: ${#files[@]} files ok"
  exit $bad
fi
clang-format --style=file -i "${files[@]}"
