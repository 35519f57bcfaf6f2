#!/bin/sh
# Install what building and testing gpumem needs, if it is missing (Debian/Ubuntu, as root or
# with sudo). Idempotent and quiet when everything is there.
set -e
need=""
command -v cmake >/dev/null 2>&1 || need="$need cmake"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
[ -f /usr/include/zlib.h ] || need="$need zlib1g-dev"
command -v python3 >/dev/null 2>&1 || need="$need python3"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
[ -z "$need" ] && exit 0
echo "install_deps: installing$need" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null
