#!/bin/sh
# docs/cli.md's Examples, run: every `gpumem` line of the block exits as its comment says (0
# unless "exit N"), with the tool under test, from the source folder (the lines name
# traces/...); a comment "A -> B" about reserved/live or device calls must hold; an
# initial_reserve line must not raise reserved/live (the page's old example made gpt2_generate
# worse: 1.212 -> 1.413) and, when its comment calls it replay's advice, must be the value
# replay advises today, unless its comment says "not advised" (a counter-example: then replay
# must not advise it and it must raise reserved/live).
# Lines that need a GPU (--backend cuda) or a PyTorch snapshot are skipped.
# usage: cli_examples.sh GPUMEM_BINARY SOURCE_DIR
set -u
GPUMEM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SRC=$2
T=$(mktemp -d /tmp/gpumem_cli_examples.XXXXXX)
trap 'rm -rf "$T"' EXIT
cd "$SRC" || exit 1
awk '/^## Examples/ {s = 1} s && /^```sh$/ {c = 1; next} c && /^```$/ {exit} c' docs/cli.md \
    >"$T/examples"
[ -s "$T/examples" ] || { echo "FAILED: no Examples block in docs/cli.md"; exit 1; }
python3 - "$GPUMEM" "$T" <<'PY'
import json, re, subprocess, sys
gpumem, tmp = sys.argv[1], sys.argv[2]
failed = ran = 0
def replay_json(args):
    r = subprocess.run([gpumem, "replay", "--json", "--no-progress", "--allow-oom"] + args,
                       capture_output=True, text=True)
    return json.loads(r.stdout)
for line in open(tmp + "/examples"):
    cmd, _, comment = line.rstrip("\n").partition("#")
    words = cmd.split()
    if not words or words[0] != "gpumem" or "cuda" in words or "&&" in words:
        continue
    cmd = cmd.replace("> out.json", "> %s/out.json" % tmp).replace("report.html", tmp + "/r.html")
    want = int(re.search(r"exit (\d)", comment).group(1)) if re.search(r"exit (\d)", comment) else 0
    r = subprocess.run("%s %s" % (gpumem, cmd.split(None, 1)[1]), shell=True,
                       capture_output=True, text=True)
    ran += 1
    if r.returncode != want:
        print("FAILED: %s exited %d, the page says %d" % (cmd.strip(), r.returncode, want))
        failed += 1
    m = re.search(r"--set initial_reserve=(\d+) (\S+)", cmd)
    if m:
        value, trace = int(m.group(1)), m.group(2)
        base, tried = replay_json([trace]), replay_json(["--set", "initial_reserve=%d" % value, trace])
        counter = "not advised" in comment  # shown as what replay warns against
        ratio = re.search(r"(\d\.\d+) -> (\d\.\d+)", comment)
        calls = re.search(r"(\d+) device calls -> (\d+)", comment)
        checks = []
        if counter:
            checks.append(("replay does not advise it",
                           base["recommended_initial_reserve"] != value))
            checks.append(("it raises reserved/live, as the page says",
                           tried["reserved_over_live"] > base["reserved_over_live"]))
        else:  # shown as a pre-sized pool that helps
            checks.append(("it does not raise reserved/live (%.3f -> %.3f)"
                           % (base["reserved_over_live"], tried["reserved_over_live"]),
                           tried["reserved_over_live"] <= base["reserved_over_live"]))
            if "advice" in comment:
                checks.append(("replay advises it", base["recommended_initial_reserve"] == value))
        if ratio:
            got = "%.3f -> %.3f" % (base["reserved_over_live"], tried["reserved_over_live"])
            checks.append(("reserved/live %s (measured %s)" % (ratio.group(0), got),
                           got == ratio.group(0)))
        if calls:
            got = "%d device calls -> %d" % (sum(base["device_calls"].values()),
                                             sum(tried["device_calls"].values()))
            checks.append(("%s (measured %s)" % (calls.group(0), got), got == calls.group(0)))
        for what, good in checks:
            if not good:
                print("FAILED: %s: %s" % (cmd.strip(), what))
                failed += 1
print("%d examples run, %d failed" % (ran, failed))
sys.exit(1 if failed or ran < 5 else 0)
PY
