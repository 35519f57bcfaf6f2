# What the command-line test scripts share, sourced first by each: their arguments
# (GPUMEM_BINARY SOURCE_DIR) as $GPUMEM and $SRC, a scratch folder $T removed at exit, and the
# checks below.
set -u
GPUMEM=$1
SRC=$2
T=$(mktemp -d /tmp/gpumem_cli_test.XXXXXX)
trap 'rm -rf "$T"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAILED: $*" >&2; }

# run RC ARGS...: run gpumem, keep stdout/stderr in $T/out, $T/err; check the exit code.
run() {
    want=$1
    shift
    "$GPUMEM" "$@" >"$T/out" 2>"$T/err"
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else
        bad "gpumem $* exited $got, want $want"
        sed 's/^/    stderr: /' "$T/err" | head -5 >&2
    fi
}
has() { # has FILE TEXT
    if grep -qF -- "$2" "$1"; then ok; else bad "$(basename "$1") lacks \"$2\""; fi
}
lacks() { # lacks FILE TEXT
    if grep -qF -- "$2" "$1"; then bad "$(basename "$1") has \"$2\""; else ok; fi
}
json() { # json FILE PYTHON-ASSERTION (d is the parsed document)
    if python3 -c "import json,sys; d=json.load(open(sys.argv[1], encoding='utf-8')); assert $2, d" \
        "$1" >/dev/null 2>"$T/pyerr"; then ok; else
        bad "JSON check failed: $2"
        tail -1 "$T/pyerr" | cut -c1-300 >&2
    fi
}
