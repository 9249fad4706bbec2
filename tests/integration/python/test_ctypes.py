#!/usr/bin/python3
"""The ctypes layer (python/wagma/__init__.py) against the stub library: the ImportError, the
structs' layout against the C compiler's view of worker.h, every call, errors with the
library's message, log lines (also from a library thread) and the state callbacks."""

import ctypes
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import _support

STUB = _support.setup()

import wagma  # noqa: E402
from _support import stub_env, stub_stats  # noqa: E402

TMP = tempfile.TemporaryDirectory(prefix="wagma-test-ctypes-")


class Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage(), record.threadName))


def _import_error(env_library):
    env = dict(os.environ)
    env.pop("WAGMA_LIBRARY", None)
    if env_library is not None:
        env["WAGMA_LIBRARY"] = env_library
    r = subprocess.run([sys.executable, "-c", "import wagma"], env=env, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stderr


class ImportTest(unittest.TestCase):
    def test_missing_path(self):
        rc, err = _import_error("/nonexistent/libwagma.so")
        self.assertNotEqual(rc, 0)
        self.assertIn("ImportError", err)
        self.assertIn("$WAGMA_LIBRARY='/nonexistent/libwagma.so'", err)
        self.assertIn("cannot open shared object file", err)

    def test_not_the_worker_library(self):
        rc, err = _import_error("libm.so.6")
        self.assertNotEqual(rc, 0)
        self.assertIn("ImportError", err)
        self.assertIn("is not the worker library", err)

    def test_system_library(self):
        try:
            ctypes.CDLL("libwagma.so.0")
            self.skipTest("libwagma.so.0 is installed on this system")
        except OSError:
            pass
        rc, err = _import_error(None)
        self.assertNotEqual(rc, 0)
        self.assertIn("$WAGMA_LIBRARY is not set and libwagma.so.0", err)
        self.assertIn("cmake --install", err)


    def test_installed_layout(self):
        """As `cmake --install` lays it out (python/CMakeLists.txt, worker/): the package in
        <prefix>/lib/python3.X/dist-packages finds <prefix>/lib/libwagma.so.0 before ldconfig."""
        try:
            ctypes.CDLL("libwagma.so.0")
            self.skipTest("libwagma.so.0 is installed on this system")
        except OSError:
            pass
        prefix = os.path.join(TMP.name, "prefix")
        site = os.path.join(prefix, "lib", f"python3.{sys.version_info[1]}", "dist-packages")
        shutil.copytree(os.path.join(_support.SOURCE_DIR, "python", "wagma"),
                        os.path.join(site, "wagma"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        env = {k: v for k, v in os.environ.items() if k not in ("WAGMA_LIBRARY", "PYTHONPATH")}
        env["PYTHONPATH"] = site
        code = "import wagma; print(wagma.library_path)"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60, cwd=TMP.name)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(os.path.join(prefix, "lib", "libwagma.so.0"), r.stderr)  # what was tried
        shutil.copy(STUB, os.path.join(prefix, "lib", "libwagma.so.0"))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60, cwd=TMP.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), os.path.join(prefix, "lib", "libwagma.so.0"))


class LayoutTest(unittest.TestCase):
    """ctypes' offsets and sizes against offsetof/sizeof compiled with worker.h."""

    def test_layout(self):
        f = wagma._lib.wagma_stub_layout
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        buf = ctypes.create_string_buffer(8192)
        n = f(buf, len(buf))
        self.assertLess(n, len(buf))
        structs = {"wagma_worker_config_t": wagma._Config,
                   "wagma_worker_status_t": wagma._Status,
                   "wagma_worker_state_fns_t": wagma._StateFns}
        checked = 0
        for line in buf.value.decode().splitlines():
            name, off, size = line.split()
            if "." in name:
                s, field = name.split(".")
                d = getattr(structs[s], field)
                self.assertEqual((d.offset, d.size), (int(off), int(size)), name)
                # every C field is a ctypes field, in the same order
            else:
                self.assertEqual(ctypes.sizeof(structs[name]), int(size), name)
            checked += 1
        self.assertEqual(checked, 3 + sum(len(s._fields_) for s in structs.values()))

    def test_status_codes(self):
        self.assertEqual(wagma.Status.EINVAL, -1)
        self.assertEqual(wagma.Status.EINTERNAL, -19)
        hdr = os.path.join(_support.SOURCE_DIR, "common", "include", "wagma", "status.h")
        with open(hdr) as f:
            text = f.read()
        for s in wagma.Status:
            if s != wagma.Status.OK:
                self.assertIn(f"WAGMA_{s.name} = {int(s)},", text)


class WorkerTest(unittest.TestCase):
    def setUp(self):
        self.cap = Capture()
        logging.getLogger("wagma").addHandler(self.cap)
        logging.getLogger("wagma").setLevel(logging.DEBUG)

    def tearDown(self):
        logging.getLogger("wagma").removeHandler(self.cap)

    def test_open_errors(self):
        saved = os.environ.pop("WAGMA_AGENT_SOCKET")
        try:
            with self.assertRaises(wagma.WagmaError) as c:
                wagma.Worker()
            self.assertEqual(c.exception.status, wagma.Status.EINVAL)
            self.assertIn("WAGMA_AGENT_SOCKET is not set", c.exception.message)
        finally:
            os.environ["WAGMA_AGENT_SOCKET"] = saved
        with self.assertRaises(wagma.WagmaError) as c:
            wagma.Worker("unreachable")
        self.assertEqual(c.exception.status, wagma.Status.EUNAVAIL)
        self.assertIn("unreachable", str(c.exception))
        self.assertTrue(str(c.exception).startswith("WAGMA_EUNAVAIL: "))

    def test_config_and_log(self):
        with stub_env(ITERATIONS=3, ALGORITHM="local-sgd", BATCH=16, WORKERS=5, SEED=99,
                      AGENT="a7"):
            w = wagma.Worker("/run/some.sock")
        c = w.config
        self.assertEqual((c.job, c.agent, c.algorithm), ("stub-job", "a7", "local-sgd"))
        self.assertEqual((c.iterations, c.epochs, c.batch_size, c.workers, c.seed),
                         (3, 0, 16, 5, 99))
        self.assertEqual((c.global_sync, c.device, c.staleness_bound, c.group_size),
                         ("wait-avoiding", "cpu", 4, 2))
        msgs = [m for _, m, _ in self.cap.records]
        self.assertIn("stub: open /run/some.sock", msgs)
        # a log line from a thread of the library's own
        self.assertIn("stub: hello from the control thread", msgs)
        w.close()
        self.assertEqual(self.cap.records[-1][:2], (logging.DEBUG, "stub: close"))

    def test_spec_and_unavailable(self):
        with stub_env(SPEC='{"name": "j1", "program": {"name": "fmnist", "args": ["--x"]}}'):
            w = wagma.Worker("/run/some.sock")
            self.assertEqual(w.spec["program"], {"name": "fmnist", "args": ["--x"]})
        w.unavailable("no data here")
        self.assertIn("stub: unavailable: no data here", [m for _, m, _ in self.cap.records])
        w.close()

    def test_loop(self):
        with stub_env(ITERATIONS=5, RANK=2, WORKERS=4):
            w = wagma.Worker()
        params = (ctypes.c_float * 8)(*range(8))
        self.assertEqual(w.status().rank, -1)
        w.register(params, 8)
        st = w.status()
        self.assertEqual((st.epoch, st.rank, st.size, st.iteration, st.joined), (1, 2, 4, 0, False))
        steps = 0
        while not w.should_stop():
            w.average_gradients(params)
            w.step()
            w.report(loss=1.5, accuracy=None)
            steps += 1
        self.assertEqual(steps, 5)
        st = w.status()
        self.assertEqual(st.iteration, 5)
        self.assertEqual(st.group, (2, 3))
        self.assertEqual(st.staleness, 2)
        counts, last = stub_stats(w)
        self.assertEqual(counts[:3], (5, 5, 5))
        self.assertEqual(last[0], 1.5)
        self.assertNotEqual(last[1], last[1])  # NaN: unknown
        w.final_average()
        w.done(0.25, 0.875)
        w.close()
        w.close()  # idempotent
        counts, last = stub_stats()
        self.assertEqual((counts[3], counts[5]), (1, 1))
        self.assertEqual(last, (0.25, 0.875))
        with self.assertRaises(wagma.WagmaError) as c:
            w.step()
        self.assertEqual(c.exception.status, wagma.Status.ECLOSED)
        self.assertEqual(w.last_error(), "")

    def test_errors_carry_the_message(self):
        with wagma.Worker() as w:
            with self.assertRaises(wagma.WagmaError) as c:
                w.step()
            self.assertEqual(c.exception.status, wagma.Status.EINVAL)
            self.assertEqual(c.exception.message, "wagma_worker_step: step: not registered")
            self.assertEqual(w.last_error(), "step: not registered")
            with self.assertRaises(wagma.WagmaError) as c:
                w.register(0, 0)
            self.assertIn("register: no parameters", c.exception.message)
            with self.assertRaises(wagma.WagmaError):
                w.register(0, 4, size=lambda: 0)  # size without save and load
            self.assertEqual(wagma.strerror(-17), "canceled")
        self.assertEqual(w.handle, 0)

    def test_unknown_status(self):
        e = wagma.WagmaError(-99, "odd")
        self.assertEqual(e.status, -99)
        self.assertEqual(str(e), "WAGMA_-99: odd")

    def test_state_callbacks(self):
        """A survivor's state through save, a joiner's through load (the stub's file)."""
        d = TMP.name
        path = os.path.join(d, "state")
        state_a = [0.5, -1.0, 3.0]
        with stub_env(ITERATIONS=4, SAVE_TO=path, SAVE_AT=2):
            a = wagma.Worker()
        pa = (ctypes.c_float * 4)(1, 2, 3, 4)
        saved = []

        def save_a(buf):
            self.assertEqual(len(buf), 3)
            buf[:] = state_a
            saved.append(1)

        a.register(pa, 4, size=lambda: 3, save=save_a, load=lambda buf: self.fail("load"))
        a.step()
        self.assertEqual(saved, [])
        a.step()
        self.assertEqual(saved, [1])
        a.close()

        with stub_env(ITERATIONS=4, JOIN_FROM=path):
            b = wagma.Worker()
        pb = (ctypes.c_float * 4)()
        got = []
        b.register(pb, 4, size=lambda: 3, save=lambda buf: None,
                   load=lambda buf: got.extend(memoryview(buf).cast("B").cast("f").tolist()))
        self.assertEqual(list(pb), [1, 2, 3, 4])
        self.assertEqual(got, state_a)
        st = b.status()
        self.assertTrue(st.joined)
        self.assertEqual(st.iteration, 2)
        b.close()

        # a joiner whose state has another length: the library's error, not a crash
        with stub_env(JOIN_FROM=path):
            c = wagma.Worker()
        with self.assertRaises(wagma.WagmaError) as e:
            c.register((ctypes.c_float * 4)(), 4, size=lambda: 5, save=lambda b: None,
                       load=lambda b: None)
        self.assertEqual(e.exception.status, wagma.Status.EPROTO)
        self.assertIn("state of 5 floats, the survivor sent 3", e.exception.message)
        c.close()

    def test_callback_exception_is_raised(self):
        d = TMP.name
        with stub_env(SAVE_TO=os.path.join(d, "s"), SAVE_AT=1):
            w = wagma.Worker()

        def save(buf):
            raise RuntimeError("boom in save")

        w.register((ctypes.c_float * 2)(), 2, size=lambda: 1, save=save, load=lambda b: None)
        with self.assertRaises(RuntimeError) as c:
            w.step()
        self.assertIn("boom in save", str(c.exception))
        w.step()  # the error was consumed
        w.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
