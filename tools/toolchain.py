"""Finds what the ops are compiled with, for the interpreter that runs this script (the target
environment): the MPI C++ compiler and TensorFlow's compile/link flags, the latter cached.

    python tools/toolchain.py mpicxx            the MPI compiler wrapper's path
    python tools/toolchain.py cflags CACHE      TensorFlow's compile flags
    python tools/toolchain.py lflags CACHE      TensorFlow's link flags
    python tools/toolchain.py check CACHE       both, or an error naming what was looked for

Run by the Makefile and setup.py with a clean environment (no PYTHONPATH, no PYTHONNOUSERSITE):
pip's isolated build puts only the build requirements on sys.path, while the ops must be built
against the TensorFlow and MPI of the environment the package is installed into.

MPI: $MPICXX if set; else the mpicxx beside this interpreter (a venv with PyPI's mpich); else
the mpicxx of the `mpich` package this interpreter sees (a venv whose site-packages come from
another environment); else mpicxx on PATH. Paths are canonical (symlinks resolved), so two
spellings of one environment give the same flags and share objects.

TensorFlow: importing it takes seconds, so its flags are kept in CACHE under a key that changes
when TensorFlow does (its directory, version and the mtime of its framework library); a stale or
missing cache is rewritten. Exit status 1 with the reason on stderr when either is not found.
"""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys


class NotFound(Exception):
    pass


def _executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_mpicxx():
    env = os.environ.get("MPICXX")
    if env:
        path = shutil.which(env)
        if not path:
            raise NotFound(f"MPICXX={env} is not an executable file")
        return path
    looked = []
    sibling = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    looked.append(sibling)
    if _executable(sibling):
        return os.path.realpath(sibling)
    try:
        files = importlib.metadata.distribution("mpich").files or []
        for f in files:
            if str(f).replace("\\", "/").endswith("bin/mpicxx"):
                path = str(f.locate())
                looked.append(path)
                if _executable(path):
                    return os.path.realpath(path)
    except importlib.metadata.PackageNotFoundError:
        looked.append(f"the mpich package (not installed for {sys.executable})")
    path = shutil.which("mpicxx")
    looked.append("mpicxx on PATH")
    if path:
        return os.path.realpath(path)
    raise NotFound("no MPI C++ compiler found for " + sys.executable + "; looked for $MPICXX (unset), "
                   + ", ".join(looked) + ". Install MPI into that environment (pip install mpich) or a "
                   "system MPI (e.g. apt install libmpich-dev), or set MPICXX=/path/to/mpicxx")


def tf_key():
    """Cheap: finds TensorFlow without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        raise NotFound(f"TensorFlow is not importable by {sys.executable} (no `tensorflow` module on its "
                       "sys.path); install tensorflow or tensorflow-cpu into the environment mlsl_tf is "
                       "built for")
    tf_dir = os.path.realpath(os.path.dirname(spec.origin))
    stamps = []
    for name in ("libtensorflow_framework.so.2", "__init__.py", os.path.join("python", "framework", "versions.py")):
        try:
            stamps.append(str(os.stat(os.path.join(tf_dir, name)).st_mtime_ns))
        except OSError:
            stamps.append("-")
    return " ".join([tf_dir] + stamps)


def _canonical(flags):
    out = []
    for flag in flags:
        for prefix in ("-I", "-L"):
            if flag.startswith(prefix) and len(flag) > 2:
                flag = prefix + os.path.realpath(flag[2:])
        out.append(flag)
    return " ".join(out)


def tf_flags(cache):
    """{"cflags": ..., "lflags": ...}, from CACHE when its key is current."""
    key = tf_key()
    try:
        with open(cache) as f:
            data = json.load(f)
        if data.get("key") == key:
            return data
    except (OSError, ValueError):
        pass
    try:
        import tensorflow as tf  # noqa: PLC0415 (seconds: only when the cache is stale)
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        raise NotFound(f"TensorFlow is not importable by {sys.executable}: {type(e).__name__}: {e}") from None
    data = {"key": key, "version": tf.__version__,
            "cflags": _canonical(tf.sysconfig.get_compile_flags()),
            "lflags": _canonical(tf.sysconfig.get_link_flags())}
    os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
    tmp = f"{cache}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, cache)
    return data


def main(argv):
    what = argv[0] if argv else ""
    if what not in ("mpicxx", "cflags", "lflags", "check") or (what != "mpicxx" and len(argv) != 2):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        if what == "mpicxx":
            print(find_mpicxx())
        elif what == "check":
            mpicxx, data = find_mpicxx(), tf_flags(argv[1])
            print(f"MPI compiler: {mpicxx}\nTensorFlow {data['version']}: {data['key'].split()[0]}")
        else:
            print(tf_flags(argv[1])[what])
    except NotFound as e:
        print(f"mlsl_tf build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
