"""Run a Python script with gpumem as PyTorch's CUDA allocator (docs/torch.md):

    python -m gpumem.torch [--conf SETTINGS] script.py [ARGS...]
    python -m gpumem.torch [--conf SETTINGS] -m module [ARGS...]

The script runs as __main__ with sys.argv = [script.py, ARGS...], exactly as `python script.py
ARGS` would run it, after gpumem.torch.enable(conf) (conf defaults to $GPUMEM_CONF).
"""

import runpy
import sys

USAGE = "usage: python -m gpumem.torch [--conf SETTINGS] (script.py | -m module) [ARGS...]"


def main(argv):
    conf = None
    while argv and argv[0].startswith("--conf"):
        if argv[0] == "--conf":
            if len(argv) < 2:
                sys.exit(USAGE)
            conf, argv = argv[1], argv[2:]
        else:
            conf, argv = argv[0].split("=", 1)[1], argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    import gpumem.torch
    gpumem.torch.enable(conf)
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.exit(USAGE)
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
