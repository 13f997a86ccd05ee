#!/usr/bin/env bash
# The README is the front door: it must name every benchmark (bench/*_bench.c and
# bench/*.sh), link every document (docs/*.md) and every module's folder, and it and the docs
# speak of the project, not of the issues that built it. Usage: readme_lists.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: readme_lists.sh SOURCE_DIR}
readme="$src/README.md"
fail=0
complain() {
  echo "readme_lists: $*" >&2
  fail=1
}
[ -f "$readme" ] || { echo "readme_lists: no $readme" >&2; exit 1; }

n=0
for f in "$src"/bench/*_bench.c "$src"/bench/*.sh; do
  [ -e "$f" ] || continue
  name=$(basename "$f")
  name=${name%.c}
  n=$((n + 1))
  grep -q "\`$name\`\|bench/$name" "$readme" || complain "README.md does not name the benchmark $name"
done
[ "$n" -gt 0 ] || complain "no benchmarks found under $src/bench"

n=0
for f in "$src"/docs/*.md; do
  [ -e "$f" ] || continue
  n=$((n + 1))
  grep -q "](docs/$(basename "$f"))" "$readme" || complain "README.md does not link docs/$(basename "$f")"
done
[ "$n" -gt 0 ] || complain "no documents found under $src/docs"

# Every folder with a CMakeLists.txt of its own is a module and has its row.
for d in "$src"/*/; do
  m=$(basename "$d")
  case "$m" in build | tests | bench | docs | scripts | fuzz) continue ;; esac
  [ -f "$d/CMakeLists.txt" ] || continue
  grep -q "\`$m/\`" "$readme" || complain "README.md has no row for the module $m/"
done

# Issue numbers belong to the tracker: "issue #7", "issues #4, #7".
for f in "$readme" "$src"/docs/*.md "$src"/*/README.md; do
  [ -e "$f" ] || continue
  if grep -n -i -E "issues? #[0-9]" "$f" >&2; then
    complain "${f#"$src"/} speaks of issue numbers (above)"
  fi
done
[ "$fail" -eq 0 ] && echo "readme_lists: README names every benchmark, document and module"
exit "$fail"
