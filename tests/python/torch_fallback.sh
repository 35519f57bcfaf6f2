#!/bin/sh
# pip install always installs the core package: with a torch the backend cannot be built against
# (a fake one on PYTHONPATH: too old, or without its C++ extension tools), pip succeeds, gpumem
# imports, and gpumem.torch.enable() says why there is no backend (docs/torch.md, "Build").
# usage: torch_fallback.sh SOURCE_DIR
set -u
SRC=$1
T=$(mktemp -d /tmp/gpumem_torch_fallback.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail=0
for case in "2.3.0:older than PyTorch 2.4" "2.99.0:ModuleNotFoundError"; do
    ver=${case%%:*} want=${case#*:}
    mkdir -p "$T/fake$ver/torch"
    echo "__version__ = \"$ver\"" > "$T/fake$ver/torch/__init__.py"
    if ! PYTHONPATH="$T/fake$ver" GPUMEM_BUILD_BASE="$T/build$ver" python3 -m pip install -q \
        --no-build-isolation --no-deps --no-cache-dir --disable-pip-version-check \
        --target "$T/site$ver" "$SRC" > "$T/pip$ver.log" 2>&1; then
        echo "FAILED: pip install with torch $ver"; tail -20 "$T/pip$ver.log"; fail=1; continue
    fi
    out=$(cd "$T" && PYTHONPATH="$T/site$ver:$T/fake$ver" python3 -c '
import gpumem, gpumem.torch as g
try:
    g.enable(); print("enable() did not fail")
except g.GpumemError as e:
    print(e)
print(g.build_info())' 2>&1)
    case $out in
    *"$want"*"PyTorch 2.4 to 2.15"*"'built': False"*) echo "torch $ver: ok" ;;
    *) echo "FAILED: torch $ver: enable() or build_info() does not say why:"; echo "$out"; fail=1 ;;
    esac
done
exit $fail
