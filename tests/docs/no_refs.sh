#!/bin/sh
# User documentation stands on its own: README.md and docs/*.md (but docs/benchmarks.md, the
# lab notebook, which may name sessions and issues) cite no issue numbers and no sections of
# the design document ("DESIGN.md §4"): a reader has neither.
# usage: no_refs.sh SOURCE_DIR
set -u
SRC=$1
hits=$(mktemp)
trap 'rm -f "$hits"' EXIT
for f in "$SRC/README.md" "$SRC"/docs/*.md; do
    [ "$(basename "$f")" = benchmarks.md ] && continue
    { grep -n -i -E "issues? #?[0-9]|issue's|this issue|the issue asked" "$f"
      grep -n -E "DESIGN\.md|§" "$f"; } | sed "s|^|FAILED: ${f#"$SRC"/}:|" >>"$hits"
done
if [ -s "$hits" ]; then cat "$hits"; exit 1; fi
echo "no issue numbers or design-document sections cited"
