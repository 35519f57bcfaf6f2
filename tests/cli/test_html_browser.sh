#!/bin/sh
# Open a `gpumem replay --html` report in Debian's headless chromium and check, in the rendered
# DOM, the marker the page's script sets once every timeline polyline has a nonzero length and
# width (data-timeline-rendered="yes", data-timeline-points > 0) and the block map was drawn.
# The browser is this test's own business: without chromium it installs it (tools/install_deps.sh
# browser: apt-get, as root or with sudo) unless GPUMEM_NO_BROWSER_INSTALL is set, and when it
# still has none it skips (exit 77), so neither `make run` nor a machine without apt-get needs it.
# usage: test_html_browser.sh GPUMEM_BINARY SOURCE_DIR
set -u
GPUMEM=$1
SRC=$2
find_browser() { command -v chromium || command -v chromium-browser || true; }
BROWSER=$(find_browser)
if [ -z "$BROWSER" ] && [ -z "${GPUMEM_NO_BROWSER_INSTALL:-}" ]; then
    echo "chromium is not installed: trying tools/install_deps.sh browser"
    sh "$SRC/tools/install_deps.sh" browser || true
    BROWSER=$(find_browser)
fi
if [ -z "$BROWSER" ]; then
    echo "SKIPPED: no chromium (install it with: tools/install_deps.sh browser)"
    exit 77
fi
T=$(mktemp -d /tmp/gpumem_html_test.XXXXXX)
trap 'rm -rf "$T"' EXIT
if ! "$GPUMEM" replay --no-progress --html "$T/report.html" "$SRC/traces/resnet_train.csv.gz" \
    >"$T/out" 2>"$T/err"; then
    echo "FAILED: gpumem replay --html exited nonzero" >&2
    cat "$T/err" >&2
    exit 1
fi
# The same trace on VMM segments: a span labelled by its mapped bytes, not its virtual range.
if ! "$GPUMEM" replay --no-progress --segments vmm --html "$T/vmm.html" \
    "$SRC/traces/resnet_train.csv.gz" >"$T/out" 2>"$T/err"; then
    echo "FAILED: gpumem replay --segments vmm --html exited nonzero" >&2
    cat "$T/err" >&2
    exit 1
fi
render() { # render PAGE DOM
    rm -rf "$T/profile"
    mkdir "$T/profile"
    timeout 120 "$BROWSER" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$T/profile" --dump-dom "file://$1" >"$2" 2>"$T/browser.err"
}
render "$T/report.html" "$T/dom.html"
render "$T/vmm.html" "$T/vmm_dom.html"
body=$(grep -o '<body[^>]*>' "$T/dom.html" | head -1)
vmm_body=$(grep -o '<body[^>]*>' "$T/vmm_dom.html" | head -1)
echo "rendered: $body"
echo "rendered (vmm): $vmm_body"
passed=0
failed=0
check() { # check DESCRIPTION COMMAND...
    if "$@"; then passed=$((passed + 1)); else
        failed=$((failed + 1))
        echo "FAILED: $1" >&2
    fi
}
rendered() { echo "$body" | grep -q 'data-timeline-rendered="yes"'; }
points() {
    n=$(echo "$body" | sed -n 's/.*data-timeline-points="\([0-9]*\)".*/\1/p')
    [ -n "$n" ] && [ "$n" -gt 0 ]
}
blocks() {
    n=$(echo "$body" | sed -n 's/.*data-map-blocks="\([0-9]*\)".*/\1/p')
    [ -n "$n" ] && [ "$n" -gt 0 ]
}
# Segment labels fit left of the bars (none clipped); the allocated line is drawn wider than
# live, so it shows; a VMM span's label gives its mapped bytes ("... MiB mapped"), and its
# virtual range only in the tooltip.
labels_fit() { echo "$body" | grep -q 'data-labels-fit="yes"' &&
    echo "$vmm_body" | grep -q 'data-labels-fit="yes"'; }
allocated_visible() { echo "$body" | grep -q 'data-allocated-visible="yes"'; }
vmm_label() { grep -Eq '<text[^>]*class="seg"[^>]*>0x[0-9a-f]+ [0-9.]+ [KMG]iB mapped' "$T/vmm_dom.html"; }
check rendered
check points
check blocks
check labels_fit
check allocated_visible
check vmm_label
if [ "$failed" -ne 0 ]; then
    echo "browser stderr (tail):" >&2
    tail -5 "$T/browser.err" >&2
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
