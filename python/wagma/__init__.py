"""wagma — the Python side of libwagma, the worker library (worker/include/wagma/worker.h).

Pure Python over the C ABI with ctypes. The library is loaded at import:

  * ``$WAGMA_LIBRARY`` when set (a path to ``libwagma.so``; nothing else is tried), else
  * ``libwagma.so.0`` from the system's library path (after ``cmake --install``), else from
    the library folder of the prefix this package was installed into (before ldconfig ran).

If neither loads, ``import wagma`` raises ImportError naming what it tried.

``Worker`` wraps one ``wagma_worker_t``: every call that returns a non-zero status raises
``WagmaError(status, message)``, the message being ``wagma_worker_last_error``. The library's log
lines go to Python's ``logging`` (logger ``"wagma"``). PyTorch users want ``wagma.torch``; this
module is the thin layer below it (and what a NumPy or plain-Python program would use).

Threads: as in worker.h, one thread (the "training thread") makes every call; the state
functions run on it, inside ``register`` and ``step``. The log callback runs on the library's
threads (ctypes takes the GIL for it).
"""

import atexit
import ctypes
import enum
import json
import logging
import os
import sysconfig
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

__all__ = [
    "Status",
    "WagmaError",
    "Config",
    "WorkerStatus",
    "Worker",
    "PROTOCOL",
    "library_path",
]

PROTOCOL = 1  # WAGMA_WORKER_PROTOCOL of the header this module was written against

log = logging.getLogger("wagma")


def _default_log_handler() -> None:
    """The library's lines (epochs, joins, warnings) on stderr, which the agent puts in its log,
    unless the program configured logging itself (a handler on "wagma" or on the root logger)
    before opening the worker."""
    if log.handlers or logging.getLogger().handlers:
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("wagma: %(levelname)s %(message)s"))
    log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


class Status(enum.IntEnum):
    """enum wagma_status (common/include/wagma/status.h)."""

    OK = 0
    EINVAL = -1
    ENOMEM = -2
    EIO = -3
    ETIMEDOUT = -4
    EPROTO = -5
    EEPOCH = -6
    ECLOSED = -7
    EPEER = -8
    ENOTFOUND = -9
    EEXIST = -10
    ECONFLICT = -11
    EUNAVAIL = -12
    ECOMPACTED = -13
    EPERM = -14
    ERANGE = -15
    ENOSYS = -16
    ECANCELED = -17
    EBUSY = -18
    EINTERNAL = -19


class WagmaError(Exception):
    """A wagma call failed: ``status`` is the negative WAGMA_E* code (an int; ``Status`` when
    known), ``message`` the library's (or the wrapper's) detail message."""

    def __init__(self, status: int, message: str = ""):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        name = status.name if isinstance(status, Status) else str(int(status))
        super().__init__(f"WAGMA_{name}: {message}" if message else f"WAGMA_{name}")

    def __reduce__(self):
        return (type(self), (int(self.status), self.message))


# ---------------------------------------------------------------------------------------------
# The library


def _installed_candidates():
    """Where `cmake --install` put libwagma.so.0 next to this package: the package lives in
    <prefix>/lib/python3.X/dist-packages/wagma, the library in <prefix>/lib (or lib/<multiarch>,
    lib64), which dlopen does not search before ldconfig ran (/usr/local/lib)."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    site = os.path.dirname(pkg)
    pyver = os.path.dirname(site)
    libdir = os.path.dirname(pyver)
    if (os.path.basename(site) not in ("dist-packages", "site-packages")
            or not os.path.basename(pyver).startswith("python3")
            or os.path.basename(libdir) != "lib"):
        return []
    prefix = os.path.dirname(libdir)
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [libdir] + ([os.path.join(libdir, multiarch)] if multiarch else [])
    dirs.append(os.path.join(prefix, "lib64"))
    return [os.path.join(d, "libwagma.so.0") for d in dirs]


def _load() -> Tuple[ctypes.CDLL, str]:
    path = os.environ.get("WAGMA_LIBRARY")
    if path:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            raise ImportError(
                f"wagma: cannot load the worker library from $WAGMA_LIBRARY={path!r}: {e} "
                "(unset WAGMA_LIBRARY to use libwagma.so.0 from the system)"
            ) from None
    name = "libwagma.so.0"
    try:
        return ctypes.CDLL(name), name
    except OSError as e:
        first = str(e)
    tried = []
    for c in _installed_candidates():
        if os.path.exists(c):
            try:
                return ctypes.CDLL(c), c
            except OSError as e:
                tried.append(f"{c}: {e}")
        else:
            tried.append(c)
    also = f"; nor {', '.join(tried)}" if tried else ""
    raise ImportError(
        f"wagma: cannot load the worker library: $WAGMA_LIBRARY is not set and {name} is not "
        f"on the system's library path ({first}){also}; install wagma (cmake --install; then "
        "ldconfig for /usr/local/lib) or set WAGMA_LIBRARY to the path of libwagma.so (in a "
        "build tree: build/worker/libwagma.so)"
    ) from None


_lib, library_path = _load()

# wagma/status.h
_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
# wagma_worker_state_fns_t's members
_SIZE_FN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)
_SAVE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float))
_LOAD_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float))


class _Config(ctypes.Structure):
    """wagma_worker_config_t, field by field."""

    _fields_ = [
        ("job", ctypes.c_char * 64),
        ("agent", ctypes.c_char * 64),
        ("algorithm", ctypes.c_char * 16),
        ("iterations", ctypes.c_uint64),
        ("epochs", ctypes.c_uint64),
        ("batch_size", ctypes.c_int),
        ("workers", ctypes.c_int),
        ("seed", ctypes.c_uint64),
        ("eval_every", ctypes.c_uint64),
        ("staleness_bound", ctypes.c_int),
        ("group_size", ctypes.c_int),
        ("global_sync", ctypes.c_char * 16),
        ("device", ctypes.c_char * 8),
        ("transport", ctypes.c_char * 8),
    ]


class _Status(ctypes.Structure):
    """wagma_worker_status_t, field by field."""

    _fields_ = [
        ("epoch", ctypes.c_uint64),
        ("rank", ctypes.c_int),
        ("size", ctypes.c_int),
        ("iteration", ctypes.c_uint64),
        ("joined", ctypes.c_int),
        ("round_global", ctypes.c_int),
        ("ngroup", ctypes.c_int),
        ("group", ctypes.c_int * 64),
        ("staleness", ctypes.c_uint64),
    ]


class _StateFns(ctypes.Structure):
    """wagma_worker_state_fns_t."""

    _fields_ = [("size", _SIZE_FN), ("save", _SAVE_FN), ("load", _LOAD_FN)]


_handle = ctypes.c_void_p  # wagma_worker_t *


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


try:
    _open = _fn(
        "wagma_worker_open", ctypes.c_int, ctypes.c_char_p, _LOG_FN, ctypes.c_void_p,
        ctypes.POINTER(_handle))
    _config = _fn("wagma_worker_config", ctypes.c_int, _handle, ctypes.POINTER(_Config))
    _register = _fn(
        "wagma_worker_register", ctypes.c_int, _handle, ctypes.c_void_p, ctypes.c_size_t,
        ctypes.POINTER(_StateFns), ctypes.c_void_p)
    _set_iterations = _fn("wagma_worker_set_iterations", ctypes.c_int, _handle, ctypes.c_uint64)
    _should_stop = _fn("wagma_worker_should_stop", ctypes.c_int, _handle)
    _average_gradients = _fn(
        "wagma_worker_average_gradients", ctypes.c_int, _handle, ctypes.c_void_p)
    _step = _fn("wagma_worker_step", ctypes.c_int, _handle)
    _report = _fn("wagma_worker_report", ctypes.c_int, _handle, ctypes.c_double, ctypes.c_double)
    _status = _fn("wagma_worker_status", ctypes.c_int, _handle, ctypes.POINTER(_Status))
    _final_average = _fn("wagma_worker_final_average", ctypes.c_int, _handle)
    _done = _fn("wagma_worker_done", ctypes.c_int, _handle, ctypes.c_double, ctypes.c_double)
    _fail = _fn("wagma_worker_fail", ctypes.c_int, _handle, ctypes.c_char_p)
    _close = _fn("wagma_worker_close", None, _handle)
    _last_error = _fn("wagma_worker_last_error", ctypes.c_char_p, _handle)
except AttributeError as e:
    raise ImportError(f"wagma: {library_path} is not the worker library: {e}") from None
# newer calls: a library without them still loads; the methods say what is missing
try:
    _spec = _fn("wagma_worker_spec", ctypes.c_char_p, _handle)
    _unavailable = _fn("wagma_worker_unavailable", ctypes.c_int, _handle, ctypes.c_char_p)
    _use_cuda = _fn("wagma_worker_use_cuda", ctypes.c_int, _handle, ctypes.c_void_p)
except AttributeError:
    _spec = _unavailable = _use_cuda = None
try:
    _strerror = _fn("wagma_strerror", ctypes.c_char_p, ctypes.c_int)
except AttributeError:  # not exported: the names above are enough
    _strerror = None


def strerror(status: int) -> str:
    """wagma_strerror when the library exports it, else the status's name."""
    if _strerror is not None:
        return _strerror(int(status)).decode("utf-8", "replace")
    try:
        return Status(status).name
    except ValueError:
        return f"status {status}"


def _text(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(frozen=True)
class Config:
    """wagma_worker_config_t: the job as the agent configured it (fixed for the process)."""

    job: str
    agent: str
    algorithm: str  # "wagma", "allreduce" or "local-sgd"
    iterations: int  # 0 when the job counts epochs
    epochs: int  # 0 when iterations is set
    batch_size: int  # per member
    workers: int  # the spec's target number of members
    seed: int  # the same on every member
    eval_every: int  # 0 = none
    staleness_bound: int  # tau
    group_size: int
    global_sync: str  # "barrier" or "wait-avoiding"
    device: str  # "cpu" or "cuda"
    transport: str  # the agent's data plane: "tcp" or "nccl"

    @classmethod
    def _from_c(cls, c: _Config) -> "Config":
        return cls(
            job=_text(c.job), agent=_text(c.agent), algorithm=_text(c.algorithm),
            iterations=c.iterations, epochs=c.epochs, batch_size=c.batch_size,
            workers=c.workers, seed=c.seed, eval_every=c.eval_every,
            staleness_bound=c.staleness_bound, group_size=c.group_size,
            global_sync=_text(c.global_sync), device=_text(c.device),
            transport=_text(c.transport))


@dataclass(frozen=True)
class WorkerStatus:
    """wagma_worker_status_t: where the process stands after the last call that returned."""

    epoch: int  # plan epoch of the current communicator, 0 = none yet
    rank: int  # in that epoch; -1 before the first
    size: int  # 0 before the first
    iteration: int  # iterations completed in the job (the next round)
    joined: bool  # this epoch began with a joining sync that replaced the model
    round_global: bool  # the last wagma round was a global round
    group: Tuple[int, ...]  # the last round's group's ranks (empty when global or none)
    staleness: int  # the largest staleness of a contribution in the last round

    @classmethod
    def _from_c(cls, s: _Status) -> "WorkerStatus":
        n = max(0, min(int(s.ngroup), len(s.group)))
        return cls(
            epoch=s.epoch, rank=s.rank, size=s.size, iteration=s.iteration,
            joined=bool(s.joined), round_global=bool(s.round_global),
            group=tuple(s.group[:n]), staleness=s.staleness)


_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR}


def _address(buf) -> int:
    """A float buffer's address: an int, a ctypes pointer/array, or anything with data_ptr()
    (a torch tensor) or __array_interface__ (a NumPy array)."""
    if isinstance(buf, int):
        return buf
    if hasattr(buf, "data_ptr"):
        return int(buf.data_ptr())
    if hasattr(buf, "__array_interface__"):
        return int(buf.__array_interface__["data"][0])
    if isinstance(buf, (ctypes.Array, ctypes._Pointer)):
        return ctypes.cast(buf, ctypes.c_void_p).value or 0
    if isinstance(buf, ctypes.c_void_p):
        return buf.value or 0
    raise TypeError(f"wagma: not a buffer address: {type(buf).__name__}")


def float_array(address: int, n: int):
    """The n float32 at address as a ctypes array (buffer protocol: memoryview,
    numpy.frombuffer and torch.frombuffer read it without a copy). None when n is 0."""
    if n == 0 or not address:
        return None
    return (ctypes.c_float * n).from_address(address)


def _close_at_exit(ref):
    w = ref()
    if w is not None:
        w.close()


class Worker:
    """One wagma_worker_t: the process's membership in its job.

    ``Worker(socket_path=None, logger=...)`` connects to the agent (``socket_path`` or
    ``$WAGMA_AGENT_SOCKET``), says hello and waits for the job's configuration (``config``).
    Then ``register`` once, and per iteration ``average_gradients`` (allreduce jobs),
    the optimizer's step, ``step`` and ``report``, until ``should_stop``; at the end
    ``final_average``, ``done`` and ``close``. Usable as a context manager (closes).
    """

    def __init__(self, socket_path: Optional[str] = None,
                 logger: Optional[logging.Logger] = None):
        self._h = _handle()
        if logger is None:
            _default_log_handler()
        self._logger = logger if logger is not None else log
        self._lock = threading.Lock()
        # Kept alive for the handle's life: the library holds these pointers.
        self._log_cb = _LOG_FN(self._on_log)
        self._state_fns = None
        self._state_cbs = None
        self._params = None
        self._n = None
        self._callback_error: Optional[BaseException] = None
        path = os.fsencode(socket_path) if socket_path is not None else None
        rc = _open(path, self._log_cb, None, ctypes.byref(self._h))
        if rc == 0:
            # closed before the interpreter goes: the library's threads call _log_cb
            atexit.register(_close_at_exit, weakref.ref(self))
        if rc != 0:
            # No handle to ask for the message: the status says what failed.
            where = socket_path if socket_path is not None else os.environ.get(
                "WAGMA_AGENT_SOCKET", "($WAGMA_AGENT_SOCKET is not set)")
            raise WagmaError(rc, f"wagma_worker_open({where}): {strerror(rc)}")
        c = _Config()
        self._check(_config(self._h, ctypes.byref(c)), "wagma_worker_config")
        self.config = Config._from_c(c)

    # -- plumbing ---------------------------------------------------------------------------

    def _on_log(self, _user, level, msg):
        try:
            self._logger.log(_LEVELS.get(level, logging.INFO), "%s",
                             (msg or b"").decode("utf-8", "replace"))
        except Exception:  # never raise into the library's thread
            pass

    @property
    def handle(self) -> int:
        """The wagma_worker_t * (0 once closed)."""
        return self._h.value or 0

    def _live(self):
        if not self._h.value:
            raise WagmaError(Status.ECLOSED, "the worker is closed")
        return self._h

    def last_error(self) -> str:
        """wagma_worker_last_error: the message of the last failed call ("" if none)."""
        if not self._h.value:
            return ""
        m = _last_error(self._h)
        return m.decode("utf-8", "replace") if m else ""

    def _raise_callback_error(self):
        e, self._callback_error = self._callback_error, None
        if e is not None:
            raise e

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            msg = self.last_error() or strerror(rc)
            e = self._callback_error
            self._callback_error = None
            err = WagmaError(rc, f"{what}: {msg}")
            if e is not None:
                raise err from e
            raise err
        self._raise_callback_error()
        return rc

    # -- the calls --------------------------------------------------------------------------

    def register(self, params, n: int,
                 size: Optional[Callable[[], int]] = None,
                 save: Optional[Callable[[object], None]] = None,
                 load: Optional[Callable[[object], None]] = None) -> None:
        """wagma_worker_register: ``params`` (an address, a ctypes array/pointer, a contiguous
        float32 torch tensor or NumPy array) holds n floats and must stay valid and at that
        address until ``close``. The state functions (all or none): ``size()`` its length in
        floats, constant for the job; ``save(buf)`` writes it and ``load(buf)`` reads it, buf
        being a ctypes float array of size() (buffer protocol; None when size() is 0). An
        exception in them is raised here (or from ``step``) once the library returned."""
        h = self._live()
        if self._params is not None:
            raise WagmaError(Status.EINVAL, "register: called twice")
        addr = _address(params)
        fns = None
        if size is not None or save is not None or load is not None:
            if size is None or save is None or load is None:
                raise WagmaError(Status.EINVAL, "register: give size, save and load, or none")
            cbs = self._make_state_callbacks(size, save, load)
            fns = _StateFns(*cbs)
            self._state_cbs = cbs
            self._state_fns = fns
        self._params, self._n = params, int(n)
        rc = _register(h, addr, int(n), ctypes.byref(fns) if fns is not None else None, None)
        if rc < 0:
            self._params = None
        self._check(rc, "wagma_worker_register")

    def _make_state_callbacks(self, size, save, load):
        cache = {"n": None}

        def c_size(_user):
            try:
                if cache["n"] is None:
                    cache["n"] = int(size())
                return cache["n"]
            except BaseException as e:  # a constant length is the contract: 0 is the safe one
                self._callback_error = self._callback_error or e
                cache["n"] = 0
                return 0

        def c_save(_user, buf):
            try:
                n = c_size(None)
                save(float_array(ctypes.cast(buf, ctypes.c_void_p).value or 0, n))
            except BaseException as e:
                self._callback_error = self._callback_error or e

        def c_load(_user, buf):
            try:
                n = c_size(None)
                load(float_array(ctypes.cast(buf, ctypes.c_void_p).value or 0, n))
            except BaseException as e:
                self._callback_error = self._callback_error or e

        return _SIZE_FN(c_size), _SAVE_FN(c_save), _LOAD_FN(c_load)

    def set_iterations(self, iterations: int) -> None:
        """wagma_worker_set_iterations: the job's length for a job that counts epochs."""
        self._check(_set_iterations(self._live(), int(iterations)), "wagma_worker_set_iterations")

    def should_stop(self) -> bool:
        """wagma_worker_should_stop: the job's iterations are done or the agent said stop."""
        rc = _should_stop(self._live())
        self._check(rc, "wagma_worker_should_stop")
        return rc != 0

    def average_gradients(self, grads) -> None:
        """wagma_worker_average_gradients: grads (n floats, as params) replaced by their mean
        over the epoch's members (allreduce jobs; nothing done otherwise)."""
        self._check(_average_gradients(self._live(), _address(grads)),
                    "wagma_worker_average_gradients")

    def step(self) -> None:
        """wagma_worker_step: after the optimizer's step. WagmaError(ECANCELED) when the agent
        said stop."""
        self._check(_step(self._live()), "wagma_worker_step")

    def report(self, loss: Optional[float] = None, accuracy: Optional[float] = None) -> None:
        """wagma_worker_report: the latest training loss and test accuracy (None = unknown)."""
        nan = float("nan")
        self._check(_report(self._live(), nan if loss is None else float(loss),
                            nan if accuracy is None else float(accuracy)),
                    "wagma_worker_report")

    def status(self) -> WorkerStatus:
        """wagma_worker_status."""
        s = _Status()
        self._check(_status(self._live(), ctypes.byref(s)), "wagma_worker_status")
        return WorkerStatus._from_c(s)

    def use_cuda(self, stream: int = 0) -> None:
        """wagma_worker_use_cuda: before ``register``; the parameters (and the gradients given
        to ``average_gradients``) are then CUDA device addresses produced on ``stream`` (a
        cudaStream_t as an int, e.g. ``torch.cuda.current_stream().cuda_stream``; 0 = the
        legacy default stream)."""
        if _use_cuda is None:
            raise WagmaError(Status.ENOSYS, f"{library_path} has no wagma_worker_use_cuda")
        self._check(_use_cuda(self._live(), ctypes.c_void_p(int(stream) or None)),
                    "wagma_worker_use_cuda")

    @property
    def spec(self) -> dict:
        """wagma_worker_spec: the job's spec as the coordinator stored it (a dict), for fields
        the configuration leaves out."""
        if _spec is None:
            raise WagmaError(Status.ENOSYS, f"{library_path} has no wagma_worker_spec")
        return json.loads(_spec(self._live()).decode("utf-8", "replace"))

    def unavailable(self, why: str) -> None:
        """wagma_worker_unavailable: this member cannot serve the job (its data, its device);
        the coordinator replans without it. Close and exit 0 afterwards."""
        if _unavailable is None:
            raise WagmaError(Status.ENOSYS, f"{library_path} has no wagma_worker_unavailable")
        self._check(_unavailable(self._live(), str(why).encode("utf-8", "replace")),
                    "wagma_worker_unavailable")

    def final_average(self) -> None:
        """wagma_worker_final_average: the parameters averaged over every member."""
        self._check(_final_average(self._live()), "wagma_worker_final_average")

    def done(self, loss: Optional[float] = None, accuracy: Optional[float] = None) -> None:
        """wagma_worker_done: this member's result (the final model's loss and accuracy)."""
        nan = float("nan")
        self._check(_done(self._live(), nan if loss is None else float(loss),
                          nan if accuracy is None else float(accuracy)),
                    "wagma_worker_done")

    def fail(self, why: str) -> None:
        """wagma_worker_fail: this member cannot go on (the job fails)."""
        self._check(_fail(self._live(), str(why).encode("utf-8", "replace")), "wagma_worker_fail")

    def close(self) -> None:
        """wagma_worker_close (lingers for the peers after done). Idempotent."""
        with self._lock:
            h, self._h = self._h.value, _handle()
        if h:
            _close(h)
        # Only now may the callbacks and the registered buffer go.
        self._state_fns = self._state_cbs = None
        self._params = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._h.value:
                self.close()
        except Exception:
            pass
