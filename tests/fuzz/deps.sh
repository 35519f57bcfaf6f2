#!/bin/sh
# What `make fuzz` needs beyond the build's dependencies: clang and its libFuzzer runtime
# (Debian 12: clang-14 and libclang-rt-14-dev). Installed with apt-get when missing; quiet when
# everything is there.
set -e
need=""
command -v clang >/dev/null 2>&1 || need="$need clang"
rt=$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
case "$rt" in
    /*) [ -f "$rt" ] || need="$need libclang-rt-14-dev" ;;
    *) need="$need libclang-rt-14-dev" ;;
esac
[ -z "$need" ] && exit 0
echo "fuzz deps: installing$need" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
