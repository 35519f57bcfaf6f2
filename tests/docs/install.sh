#!/bin/sh
# Installing gpumem into a prefix of one's own, as README.md's "Install" says: then the README's
# example builds with pkg-config from that prefix and runs WITHOUT LD_LIBRARY_PATH (the .pc file
# adds an rpath for a prefix outside the system's library folders), builds with
# find_package(gpumem) and runs too, the installed library and
# tool carry an $ORIGIN-relative rpath, and the installed `gpumem` runs (--version, info).
# Before, the program failed with "libgpumem.so.0: cannot open shared object file".
# usage: install.sh BUILD_DIR SOURCE_DIR CC [CFLAGS] (the library's sanitizer flags, if any)
set -u
BUILD=$1 SRC=$2 CC=$3 CFLAGS=${4:-}
T=$(mktemp -d /tmp/gpumem_install.XXXXXX)
trap 'rm -rf "$T"' EXIT
failed=0
fail() { echo "FAILED: $*"; failed=1; }
command -v pkg-config >/dev/null 2>&1 || { echo "SKIPPED: no pkg-config"; exit 77; }

cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log"; echo "FAILED: cmake --install"; exit 1; }
pc=$(find "$T/prefix" -name gpumem.pc | head -1)
[ -n "$pc" ] || { echo "FAILED: no gpumem.pc installed"; exit 1; }
grep -q "PKG_CONFIG_PATH" "$T/install.log" || fail "the install does not say how to use the prefix (PKG_CONFIG_PATH)"

# The README's example, built with pkg-config from the prefix.
awk '/^## The API in one example/ {s = 1} s && /^```c$/ {c = 1; next} c && /^```$/ {exit} c' \
    "$SRC/README.md" >"$T/example.c"
grep -q gm_alloc "$T/example.c" || { echo "FAILED: no example in README.md"; exit 1; }
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs gpumem) ||
    { echo "FAILED: pkg-config --cflags --libs gpumem"; exit 1; }
# shellcheck disable=SC2086 # pkg-config's flags are words
"$CC" -std=c11 $CFLAGS "$T/example.c" $flags -o "$T/example" || { echo "FAILED: cc $flags"; exit 1; }
if env -u LD_LIBRARY_PATH "$T/example" >"$T/out" 2>"$T/err"; then
    grep -q "peak reserved" "$T/out" || fail "the example printed no statistics"
else
    fail "the example does not run from the prefix without LD_LIBRARY_PATH: $(cat "$T/err")"
fi
# It runs on the installed shared library, not on one found elsewhere.
env -u LD_LIBRARY_PATH ldd "$T/example" | grep -q "libgpumem.so.0 => $T/prefix/" ||
    fail "the example does not load libgpumem.so.0 from the prefix: $(ldd "$T/example" | grep gpumem)"

# The same example through find_package(gpumem) from the prefix (CMAKE_PREFIX_PATH).
mkdir -p "$T/app"
cp "$T/example.c" "$T/app/app.c"
cat >"$T/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(app C)
find_package(gpumem REQUIRED)
add_executable(app app.c)
target_link_libraries(app gpumem::gpumem)
CM
if cmake -S "$T/app" -B "$T/app/build" -DCMAKE_PREFIX_PATH="$T/prefix" -DCMAKE_C_COMPILER="$CC" \
        -DCMAKE_C_FLAGS="$CFLAGS" >"$T/app.log" 2>&1 &&
    cmake --build "$T/app/build" >>"$T/app.log" 2>&1; then
    env -u LD_LIBRARY_PATH "$T/app/build/app" | grep -q "peak reserved" ||
        fail "the find_package build of the example does not run"
else
    fail "find_package(gpumem) from the prefix: $(tail -5 "$T/app.log")"
fi

# $ORIGIN-relative rpaths on the installed library and tool.
lib=$(find "$T/prefix" -name 'libgpumem.so.0*' -type f | head -1)
for f in "$lib" "$T/prefix/bin/gpumem"; do
    readelf -d "$f" | grep -E 'RPATH|RUNPATH' | grep -q 'ORIGIN' || fail "$f has no \$ORIGIN rpath"
done
readelf -d "$T/prefix/bin/gpumem" | grep -E 'RPATH|RUNPATH' |
    grep -q "ORIGIN/$(python3 -c "import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))" \
        "$(dirname "$lib")" "$T/prefix/bin")" || fail "gpumem's rpath does not reach the library folder"

# The installed tool.
env -u LD_LIBRARY_PATH "$T/prefix/bin/gpumem" --version >"$T/out" 2>&1 && grep -q '^gpumem ' "$T/out" ||
    fail "installed gpumem --version: $(cat "$T/out")"
env -u LD_LIBRARY_PATH "$T/prefix/bin/gpumem" info >"$T/out" 2>&1 && grep -q 'capacity' "$T/out" ||
    fail "installed gpumem info: $(cat "$T/out")"

[ "$failed" -eq 0 ] && echo "installed into a temporary prefix: the example and the tool run"
exit "$failed"
