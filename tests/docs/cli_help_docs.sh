#!/bin/sh
# docs/cli.md against the tool: every option that `gpumem COMMAND --help` lists is in that
# command's synopsis in docs/cli.md (the first code block of its section) and named in the page,
# and every option of a synopsis is one the command's --help lists. (--summary was missing from
# replay's synopsis.)
# usage: cli_help_docs.sh GPUMEM_BINARY SOURCE_DIR
set -u
GPUMEM=$1 SRC=$2
T=$(mktemp -d /tmp/gpumem_help_docs.XXXXXX)
trap 'rm -rf "$T"' EXIT
for cmd in replay compare info; do
    "$GPUMEM" "$cmd" --help >"$T/$cmd.help" || { echo "FAILED: gpumem $cmd --help" >&2; exit 1; }
done
python3 - "$T" "$SRC/docs/cli.md" <<'PY'
import re, sys
tmp, doc_path = sys.argv[1], sys.argv[2]
doc = open(doc_path, encoding="utf-8").read()
OPT = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
failed = 0
for cmd in ("replay", "compare", "info"):
    helptext = open("%s/%s.help" % (tmp, cmd), encoding="utf-8").read()
    helptext = helptext.split("\n--set keys")[0]  # replay's key table follows the options
    # options: the lines of the options list (those that start with a dash)
    listed = set()
    for line in helptext.splitlines():
        if line.lstrip().startswith("-"):
            listed.update(OPT.findall(line))
    listed.discard("--help")
    m = re.search(r"^## `gpumem %s`\n(.*?)^```\n(.*?)^```" % cmd, doc, re.S | re.M)
    if not m:
        print("FAILED: docs/cli.md has no synopsis for gpumem %s" % cmd)
        failed += 1
        continue
    synopsis = set(OPT.findall(m.group(2)))
    for o in sorted(listed - synopsis):
        print("FAILED: gpumem %s --help lists %s; docs/cli.md's synopsis lacks it" % (cmd, o))
        failed += 1
    for o in sorted(synopsis - listed):
        print("FAILED: docs/cli.md's synopsis of gpumem %s has %s; --help lacks it" % (cmd, o))
        failed += 1
    for o in sorted(listed):
        if "`%s" % o not in doc:
            print("FAILED: docs/cli.md never names `%s` (gpumem %s)" % (o, cmd))
            failed += 1
    print("gpumem %s: %d options checked" % (cmd, len(listed)))
sys.exit(1 if failed else 0)
PY
