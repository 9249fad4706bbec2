"""What the Python package's tests share: the stub library (tests/integration/python/
stub_worker.c) and the environment that loads it.

Under ctest, CMake built the stub and set WAGMA_LIBRARY, PYTHONPATH and WAGMA_SOURCE_DIR. Run
by hand (/usr/bin/python3 tests/integration/python/test_x.py), the stub is compiled with cc into
a temporary folder and the package is found from this file's place in the tree."""

import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("WAGMA_SOURCE_DIR") or os.path.normpath(
    os.path.join(HERE, "..", "..", ".."))
SKIP = 77  # ctest's SKIP_RETURN_CODE


def _build_stub() -> str:
    out = tempfile.mkdtemp(prefix="wagma-pystub-")
    atexit.register(shutil.rmtree, out, True)
    lib = os.path.join(out, "libwagma_pystub.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra",
                    "-I", os.path.join(SOURCE_DIR, "worker", "include"),
                    "-I", os.path.join(SOURCE_DIR, "common", "include"),
                    os.path.join(HERE, "stub_worker.c"), "-o", lib, "-lpthread"], check=True)
    return lib


def setup():
    """Makes `import wagma` load the stub; returns its path."""
    if not os.environ.get("WAGMA_LIBRARY"):
        os.environ["WAGMA_LIBRARY"] = _build_stub()
    py = os.path.join(SOURCE_DIR, "python")
    if py not in sys.path:
        sys.path.insert(0, py)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if py not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([py] + parts)
    os.environ.setdefault("WAGMA_AGENT_SOCKET", "stub")
    return os.environ["WAGMA_LIBRARY"]


def require_torch():
    try:
        importlib.import_module("torch")
    except ImportError as e:
        print(f"skipped: torch is not importable by {sys.executable} ({e}); "
              "scripts/deps.sh installs python3-torch", flush=True)
        sys.exit(SKIP)


STUB_VARS = ("WAGMA_STUB_ITERATIONS", "WAGMA_STUB_EPOCHS", "WAGMA_STUB_ALGORITHM",
             "WAGMA_STUB_BATCH", "WAGMA_STUB_WORKERS", "WAGMA_STUB_SEED", "WAGMA_STUB_RANK",
             "WAGMA_STUB_AGENT", "WAGMA_STUB_DEVICE", "WAGMA_STUB_GRAD_SCALE",
             "WAGMA_STUB_SAVE_TO", "WAGMA_STUB_SAVE_AT", "WAGMA_STUB_JOIN_FROM",
             "WAGMA_STUB_JOIN_AT", "WAGMA_STUB_STOP_AT", "WAGMA_STUB_FINAL_CANCELED")


class stub_env:
    """with stub_env(ITERATIONS=5, ALGORITHM="allreduce"): the stub's job for the workers
    opened inside (it reads WAGMA_STUB_* at open)."""

    def __init__(self, **kv):
        self.kv = {f"WAGMA_STUB_{k}": str(v) for k, v in kv.items()}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in STUB_VARS}
        for k in STUB_VARS:
            os.environ.pop(k, None)
        os.environ.update(self.kv)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False


def stub_stats(worker=None):
    """(average, step, report, done, fail, final, set_iterations), (last loss, accuracy) of an
    open worker, or (None) of the last closed one."""
    import ctypes

    import wagma

    f = wagma._lib.wagma_stub_stats
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                  ctypes.POINTER(ctypes.c_double)]
    counts = (ctypes.c_uint64 * 7)()
    last = (ctypes.c_double * 2)()
    f(worker.handle if worker is not None else None, counts, last)
    return tuple(counts), tuple(last)
