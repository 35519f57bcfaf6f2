#!/bin/sh
# Install what gpumem needs, if it is missing (Debian/Ubuntu, as root or with sudo). Idempotent
# and quiet when everything is there.
# usage: tools/install_deps.sh [build|test|browser]
#   build (default): a C compiler, cmake, make, zlib and python3 -- all `make run` needs
#   test:            also python3 with pip, setuptools and wheel (the CLI and Python
#                    package tests: `pip install --no-build-isolation .` needs them)
#   browser:         chromium only (the HTML report's browser test installs it this way itself,
#                    or skips when it cannot)
set -e
what=${1:-build}
need=""
case $what in
build|test)
    command -v cmake >/dev/null 2>&1 || need="$need cmake"
    command -v cc >/dev/null 2>&1 || need="$need gcc"
    command -v make >/dev/null 2>&1 || need="$need make"
    [ -f /usr/include/zlib.h ] || need="$need zlib1g-dev"
    command -v python3 >/dev/null 2>&1 || need="$need python3" # make run's corpus summary
    if [ "$what" = test ]; then
        python3 -m pip --version >/dev/null 2>&1 || need="$need python3-pip"
        for m in setuptools wheel; do # for the python3 on PATH: Debian's by apt, another by pip
            python3 -c "import $m" >/dev/null 2>&1 && continue
            if ! python3 -c 'import sys; sys.exit(sys.prefix == "/usr")' 2>/dev/null; then
                need="$need python3-$m" # the system Python (pip refuses it: PEP 668)
            elif python3 -m pip --version >/dev/null 2>&1; then
                echo "install_deps: pip install $m" >&2
                python3 -m pip install --quiet --disable-pip-version-check "$m" || exit 1
            else
                need="$need python3-$m"
            fi
        done
    fi ;;
browser)
    command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
        need="$need chromium" ;;
*)
    echo "usage: tools/install_deps.sh [build|test|browser]" >&2
    exit 2 ;;
esac
[ -z "$need" ] && exit 0
echo "install_deps: installing$need" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install_deps: not root and no sudo:$need" \
        "must be installed by hand" >&2; exit 1; }
    SUDO="sudo"
fi
command -v apt-get >/dev/null 2>&1 || { echo "install_deps: no apt-get: install$need by hand" >&2
    exit 1; }
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
