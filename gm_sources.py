"""The library's C sources for the Python builds: CMakeLists.txt's GM_SOURCES, the one list of
what the library is. setup.py compiles them into gpumem._gpumem, and
integrations/torch/torch_ext.py into the static library inside gpumem.torch._C; both load this
file from the checkout (it is not part of the installed package).
"""

import os


def library_sources(root):
    """The .c files of GM_SOURCES in root/CMakeLists.txt, in its order, relative to root."""
    path = os.path.join(root, "CMakeLists.txt")
    with open(path) as f:
        text = f.read()
    if "set(GM_SOURCES" not in text:
        raise RuntimeError("%s has no set(GM_SOURCES ...)" % path)
    body = text.split("set(GM_SOURCES", 1)[1].split(")", 1)[0]
    files = [t for t in body.split() if t.endswith(".c")]
    missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
    if not files or missing:
        raise RuntimeError("%s: GM_SOURCES %s" % (
            path, "lists no C file" if not files else "lists missing files: " + ", ".join(missing)))
    return files
