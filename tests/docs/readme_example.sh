#!/bin/sh
# The README's example compiles against the library, runs, and reports an allocation failure
# once, clearly: gm_last_error's message already names the status, so printing
# gm_status_str(st) before it said "out of memory: out of memory: ..." (issue 19 part 6).
# usage: readme_example.sh CC README.md INCLUDE_DIR LIBGPUMEM.a [CFLAGS] (the library's
# sanitizer flags, if any)
set -eu
cc=$1 readme=$2 inc=$3 lib=$4 flags=${5:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The first ```c block after "## The API in one example".
awk '/^## The API in one example/ {s = 1} s && /^```c$/ {c = 1; next} c && /^```$/ {exit} c' \
    "$readme" > "$dir/example.c"
grep -q 'gm_alloc' "$dir/example.c" || { echo "FAIL: no example found in $readme"; exit 1; }
# shellcheck disable=SC2086 # flags are words
build() { "$cc" -std=c11 $flags -I"$inc" "$1" "$lib" -lpthread -ldl -lm -o "$2"; }
build "$dir/example.c" "$dir/example"
"$dir/example" > "$dir/out" 2> "$dir/err" || { echo "FAIL: the example exits nonzero"; cat "$dir/err"; exit 1; }
grep -q 'peak reserved' "$dir/out" || { echo "FAIL: the example printed no statistics"; exit 1; }
# The same program asking for more than the device has: one clear message.
sed 's/64 << 20/(size_t)1 << 50/' "$dir/example.c" > "$dir/oom.c"
grep -q '(size_t)1 << 50' "$dir/oom.c" || { echo "FAIL: the example's request size changed"; exit 1; }
build "$dir/oom.c" "$dir/oom"
"$dir/oom" > /dev/null 2> "$dir/err" || true
grep -q 'out of memory' "$dir/err" || { echo "FAIL: no out-of-memory message:"; cat "$dir/err"; exit 1; }
if grep -q 'out of memory: out of memory' "$dir/err"; then
    echo "FAIL: the example prints the status twice:"; cat "$dir/err"; exit 1
fi
echo "1 passed, 0 failed"
