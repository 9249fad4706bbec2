"""wagma.torch — an ordinary PyTorch training script as a wagma program.

The whole change to a script (examples/pytorch/fmnist_cnn.py; docs/programs.md shows the diff)::

    import wagma.torch                                  # the worker library (libwagma)
    job = wagma.torch.init()                            # joins the job; seeds torch with job.seed
    model = Net(); opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = job.wrap(opt, model)                          # registers the model; a joiner gets the
                                                        # survivors' parameters and optimizer state
    for step in job.loop():                             # instead of `for step in range(N)`
                                                        # (or: while not job.should_stop())
        ...; loss.backward(); opt.step()                # the job's algorithm runs in opt.step()
        job.report(loss)                                # progress (optional)
    loss, accuracy = job.finish(evaluate)               # final average, evaluate(model), done

What ``wrap`` does:

* **One flat buffer.** Every parameter of the model (then its float32 buffers, e.g. BatchNorm's
  running statistics) becomes a view into ONE contiguous float32 tensor on the model's device
  (the CPU or one CUDA device), registered once with ``wagma_worker_register``: its address
  never changes, so the library averages the model in place. A CUDA model is registered as
  device memory with the stream current at ``wrap`` (``wagma_worker_use_cuda``): the library
  stages it through page-locked host memory, ordered after the work queued on that stream. Do not move or re-create parameters afterwards (``model.to(...)``,
  ``model.double()``, assigning ``p.data``): ``opt.step()`` checks and raises WagmaError.
* **The optimizer's ``step``** (the same optimizer object is returned, its ``step`` wrapped):
  allreduce jobs copy the gradients into a flat gradient buffer, average them over the members
  (``wagma_worker_average_gradients``) and copy them back; then the optimizer's own step; then
  ``wagma_worker_step`` (the wagma / local-sgd averaging, the iteration count, new epochs,
  joins). A stop from the agent ends the loop at the next ``should_stop``.
* **Optimizer state for joiners.** The optimizer's state (every tensor and number of
  ``optimizer.state``, in the order of its param_groups, keys sorted) and the model's
  non-float32 buffers travel to a joiner through the state functions. Every member must send
  the same length, also a member whose optimizer has not stepped: ``wrap`` learns the state's
  layout with one no-op step (zero gradients, lr 0, hooks off) and then restores the optimizer
  and the parameters exactly, so the optimizer still behaves as a fresh one. Each entry carries
  a presence flag (absent entries stay absent on load: a fresh SGD stays fresh). Every value is
  encoded exactly (float32 as is; float64 / int64 / int32 as four 16-bit pieces).
* **Member-specific randomness.** After registering, ``wrap`` reseeds torch's global generator
  from the job's seed and this member (``reseed=False`` keeps it), so members draw different
  batches from the same data, while ``init`` seeded it with the job's seed so every member
  built the same initial model.

CPU and CUDA models (all parameters on one device). Torch 1.13 (Debian 12) and 2.x.
"""

import atexit
import functools
import hashlib
import logging
import math
import types
import weakref
from collections import OrderedDict
from typing import Callable, List, Optional, Tuple

import torch

import wagma
from wagma import Status, WagmaError

__all__ = ["init", "Job", "Stopped"]

log = logging.getLogger("wagma.torch")

_F32 = torch.float32
# dtypes carried as one float32 each, exactly
_SMALL = (torch.float16, torch.bfloat16, torch.bool, torch.uint8, torch.int8, torch.int16)
# dtypes carried as four float32 (16 bits each) of their 64-bit pattern
_WIDE = (torch.int32, torch.int64, torch.float64)

_ABSENT, _VALUE, _NONE = 0.0, 1.0, 2.0  # a state entry's flag


class Stopped(SystemExit):
    """The agent stopped this member before the end (the job was stopped, or this agent left
    it): raised by ``Job.finish``. A SystemExit with status 0: uncaught, the program ends
    quietly and successfully, as the agent expects; catch it to do something else."""

    def __init__(self, why: str = ""):
        super().__init__(0)
        self.why = why

    def __str__(self):
        return f"wagma: stopped by the agent{': ' + self.why if self.why else ''}"


def init(samples: Optional[int] = None, batch_size: Optional[int] = None,
         socket_path: Optional[str] = None, seed_torch: bool = True) -> "Job":
    """Opens the worker (connects to the agent; ``socket_path`` or ``$WAGMA_AGENT_SOCKET``) and
    returns the Job. ``seed_torch``: ``torch.manual_seed(job.seed)``, so that every member
    builds the same initial model. ``samples`` (and ``batch_size``, default the spec's): for a
    job that counts epochs, the number of training samples; also accepted by ``wrap``."""
    return Job(wagma.Worker(socket_path), samples=samples, batch_size=batch_size,
               seed_torch=seed_torch)


def _close_at_exit(ref):
    job = ref()
    if job is not None:
        job.close()


class Job:
    """This process's membership in its wagma job (made by ``init``)."""

    def __init__(self, worker: "wagma.Worker", samples: Optional[int] = None,
                 batch_size: Optional[int] = None, seed_torch: bool = True):
        self.worker = worker
        self.config = worker.config
        self.model = None
        self.optimizer = None
        self.stopped = False  # the agent said stop (wagma_worker_step returned ECANCELED)
        self._samples, self._batch_size = samples, batch_size
        self._iterations = self.config.iterations
        self._flat: Optional[_FlatBuffers] = None
        self._state: Optional[_StateCodec] = None
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))
        if seed_torch:
            torch.manual_seed(self.config.seed)

    # -- the job's configuration ------------------------------------------------------------
    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def batch_size(self) -> int:
        """The spec's batch size per member."""
        return self.config.batch_size

    @property
    def workers(self) -> int:
        """The spec's target number of members (``size`` is the current epoch's)."""
        return self.config.workers

    @property
    def algorithm(self) -> str:
        return self.config.algorithm

    @property
    def epochs(self) -> int:
        return self.config.epochs

    @property
    def iterations(self) -> int:
        """The job's iterations (computed from ``samples`` for a job that counts epochs; 0
        until then)."""
        return self._iterations

    # -- where the member stands (wagma_worker_status) --------------------------------------
    def status(self) -> "wagma.WorkerStatus":
        return self.worker.status()

    @property
    def rank(self) -> int:
        return self.worker.status().rank

    @property
    def size(self) -> int:
        return self.worker.status().size

    @property
    def epoch(self) -> int:
        """The plan epoch of the current communicator (not an epoch over the data)."""
        return self.worker.status().epoch

    @property
    def iteration(self) -> int:
        return self.worker.status().iteration

    @property
    def group(self) -> Tuple[int, ...]:
        """The last round's group (ranks; empty when global or none)."""
        return self.worker.status().group

    @property
    def staleness(self) -> int:
        return self.worker.status().staleness

    @property
    def joined(self) -> bool:
        return self.worker.status().joined

    # -- wrap -------------------------------------------------------------------------------
    def wrap(self, optimizer: "torch.optim.Optimizer", model: Optional[torch.nn.Module] = None,
             samples: Optional[int] = None, batch_size: Optional[int] = None,
             reseed: bool = True) -> "torch.optim.Optimizer":
        """Registers ``model`` (default: the optimizer's parameters) and the optimizer's state
        with the job, and returns ``optimizer`` with its ``step`` doing the job's algorithm.
        Blocks until this member is in an epoch; a joiner's model and optimizer state are the
        survivors' when it returns. See the module's documentation."""
        if self.optimizer is not None:
            raise WagmaError(Status.EINVAL, "wrap: called twice")
        if self._closed:
            raise WagmaError(Status.ECLOSED, "wrap: the job is closed")
        if samples is not None:
            self._samples = samples
        if batch_size is not None:
            self._batch_size = batch_size
        iterations = self._job_iterations()
        params, buffers, extra = _collect(optimizer, model)
        flat = _buffers_for(params, buffers)
        state = _StateCodec(optimizer, extra)
        state.discover(flat)
        self._flat, self._state = flat, state
        if flat.device.type == "cuda":
            self.worker.use_cuda(torch.cuda.current_stream(flat.device).cuda_stream)
        self.worker.register(flat.params_address(), flat.n, state.size, state.save, state.load)
        self.model, self.optimizer = model, optimizer
        if self.config.iterations == 0:
            self.worker.set_iterations(iterations)
        self._iterations = iterations
        if reseed:
            st = self.worker.status()
            key = f"{self.config.seed}/{self.config.agent}/{st.iteration}/{st.rank}".encode()
            torch.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        inner = optimizer.step
        job = self

        def step(_optimizer, closure=None):
            return job._step(inner, closure)

        # The inner step's attributes too: an LR scheduler's marks (_with_counter,
        # _wrapped_by_lr_sched) stay visible. A bound method, as a scheduler made after wrap
        # expects (it wraps optimizer.step.__func__).
        functools.update_wrapper(step, inner)
        step.__doc__ = "The optimizer's step, wrapped by wagma.torch (the job's algorithm)."
        optimizer.step = types.MethodType(step, optimizer)
        return optimizer

    def _job_iterations(self) -> int:
        """The spec's iterations, or for a job that counts epochs,
        ceil(epochs x samples / (batch_size x workers))."""
        c = self.config
        if c.iterations != 0:
            return c.iterations
        if not self._samples:
            raise WagmaError(
                Status.EINVAL,
                f"the job counts epochs ({c.epochs}), not iterations: pass samples= (the number "
                "of training samples) to wagma.torch.init() or job.wrap()")
        b = self._batch_size or c.batch_size
        if b <= 0:
            raise WagmaError(Status.EINVAL, "the job has no batch size: pass batch_size=")
        return max(1, math.ceil(c.epochs * self._samples / (b * max(1, c.workers))))

    def _step(self, inner, closure):
        if self._closed:
            raise WagmaError(Status.ECLOSED, "step: the job is closed")
        flat = self._flat
        flat.check()
        if self.config.algorithm not in ("wagma", "local-sgd"):
            # allreduce (and whatever else averages gradients: the library decides)
            if closure is not None:
                raise WagmaError(Status.EINVAL,
                                 f"{self.config.algorithm} jobs average the gradients before "
                                 "the step: step(closure) is not supported")
            flat.average_gradients(self.worker)
        loss = inner() if closure is None else inner(closure)
        try:
            self.worker.step()
        except WagmaError as e:
            if e.status != Status.ECANCELED:
                raise
            if not self.stopped:
                log.info("wagma: the agent said stop (%s)", e.message)
            self.stopped = True
        return loss

    # -- the loop ---------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True when the training loop should end (the job's iterations are done, or the agent
        said stop)."""
        if self.optimizer is None:
            raise WagmaError(Status.EINVAL, "should_stop: wrap the optimizer first")
        if self.stopped:
            return True
        if not self.worker.should_stop():
            return False
        if self._iterations and self.worker.status().iteration < self._iterations:
            self.stopped = True  # before the job's end: the agent said stop
        return True

    def loop(self):
        """The training loop's iterations: yields the job's iteration (a joiner starts at the
        survivors') until should_stop. ``for step in job.loop():`` replaces
        ``for step in range(iterations):``."""
        while not self.should_stop():
            yield self.worker.status().iteration

    def report(self, loss=None, accuracy=None) -> None:
        """The latest training loss and test accuracy for the progress reports (numbers or
        one-element tensors; None = unknown)."""
        self.worker.report(_number(loss), _number(accuracy))

    def finish(self, evaluate: Optional[Callable] = None):
        """The end of training: the final average over every member, ``evaluate(model)`` (may
        return (loss, accuracy), an accuracy, or None), done with that result, close. Returns
        what evaluate returned. If evaluate raises, the member reports failed and it is re-raised.
        When the agent stopped this member (the loop ended early), nothing is averaged or
        evaluated: it closes and raises ``Stopped`` (a SystemExit with status 0)."""
        if self.optimizer is None:
            raise WagmaError(Status.EINVAL, "finish: wrap the optimizer first")
        if self.stopped:
            self.close()
            raise Stopped("before the end of the job's iterations")
        try:
            self.worker.final_average()
        except WagmaError as e:
            if e.status != Status.ECANCELED:
                raise
            log.info("wagma: stopped before the final average (%s)", e.message)
            self.stopped = True
            self.close()
            raise Stopped(e.message) from None
        result = None
        if evaluate is not None:
            try:
                result = evaluate(self.model)
            except BaseException as e:
                try:
                    self.worker.fail(f"evaluate: {type(e).__name__}: {e}")
                finally:
                    self.close()
                raise
        loss, accuracy = _result(result)
        self.worker.done(loss, accuracy)
        self.close()
        return result

    def fail(self, why: str) -> None:
        """This member cannot go on: reports failed with why (the job fails)."""
        self.worker.fail(why)

    def close(self) -> None:
        """Closes the worker (idempotent; also at exit)."""
        if not self._closed:
            self._closed = True
            self.worker.close()

    def __enter__(self):
        return self

    def __exit__(self, etype, e, tb):
        if e is not None and not self._closed and not isinstance(e, KeyboardInterrupt):
            try:
                self.worker.fail(f"{etype.__name__}: {e}")
            except WagmaError:
                pass
        self.close()
        return False


def _number(x) -> Optional[float]:
    if x is None:
        return None
    if torch.is_tensor(x):
        return float(x.detach().reshape(-1)[0].item())
    return float(x)


def _result(r) -> Tuple[Optional[float], Optional[float]]:
    if r is None:
        return None, None
    if isinstance(r, (tuple, list)):
        if len(r) != 2:
            raise WagmaError(Status.EINVAL, "evaluate: return (loss, accuracy), an accuracy or "
                             "None")
        return _number(r[0]), _number(r[1])
    return None, _number(r)


# ---------------------------------------------------------------------------------------------
# What is registered


def _collect(optimizer, model):
    """The parameters (the model's, else the optimizer's, in order), the model's float32
    buffers (into the flat buffer) and its other buffers (into the state) as (module, name)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WagmaError(Status.EINVAL, f"wrap: not a torch.optim.Optimizer: "
                         f"{type(optimizer).__name__}")
    opt_params, seen = [], set()
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                opt_params.append(p)
    if model is None:
        return opt_params, [], []
    params = list(model.parameters())
    ids = {id(p) for p in params}
    stray = [tuple(p.shape) for p in opt_params if id(p) not in ids]
    if stray:
        raise WagmaError(Status.EINVAL, f"wrap: the optimizer has parameters that are not the "
                         f"model's (shapes {stray[:4]})")
    buffers, extra, seen = [], [], set()
    for _, mod in model.named_modules():
        for name, b in mod._buffers.items():
            if b is None or id(b) in seen:
                continue
            seen.add(id(b))
            (buffers if b.dtype == _F32 else extra).append((mod, name))
    return params, buffers, extra


def _buffers_for(params, buffers):
    devices = {p.device for p in params} | {m._buffers[n].device for m, n in buffers}
    if len(devices) > 1:
        raise WagmaError(Status.EINVAL, f"wagma.torch: the model spans {sorted(map(str, devices))}"
                         ": put all of it on one device before job.wrap()")
    device = devices.pop() if devices else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise WagmaError(Status.ENOSYS, f"wagma.torch: the model is on {device}: CPU and CUDA "
                         "models only")
    return _FlatBuffers(params, buffers, device)


class _FlatBuffers:
    """The registered memory: one flat float32 tensor on the model's device (the CPU or one
    CUDA device), every parameter then every float32 buffer a view into it, and a flat gradient
    buffer of the same length (the parameters' gradients in the first n_grad floats, zeros after
    them). Copies into and out of them run on the current stream, which the library waits for
    (device buffers: wagma_worker_use_cuda)."""

    def __init__(self, params, buffers, device):
        bad = [(tuple(p.shape), p.dtype) for p in params if p.dtype != _F32]
        bad += [(n, m._buffers[n].dtype) for m, n in buffers if m._buffers[n].dtype != _F32]
        if bad:
            raise WagmaError(Status.EINVAL, f"wagma.torch: float32 models only (found {bad[:4]})")
        if any(p.is_sparse for p in params):
            raise WagmaError(Status.EINVAL, "wagma.torch: sparse parameters are not supported")
        self.params = params
        self.n_grad = sum(p.numel() for p in params)
        self.n = self.n_grad + sum(m._buffers[n].numel() for m, n in buffers)
        if self.n == 0:
            raise WagmaError(Status.EINVAL, "wagma.torch: the model has no parameters")
        self.device = device
        flat = torch.empty(self.n, dtype=_F32, device=device)
        views: List[Tuple[object, int, int]] = []  # (tensor, offset, numel)
        off = 0
        with torch.no_grad():
            for p in params:
                k = p.numel()
                v = flat[off:off + k]
                v.copy_(p.detach().reshape(-1))
                p.data = v.view_as(p)
                views.append((p, off, k))
                off += k
            self.buffers = []
            for m, name in buffers:
                b = m._buffers[name]
                k = b.numel()
                v = flat[off:off + k]
                v.copy_(b.detach().reshape(-1))
                m._buffers[name] = v.view_as(b)
                self.buffers.append((m, name, off, k))
                off += k
        self.flat = flat
        # The registered length (the buffers' part stays zero): the library reads and writes n
        self.grads = torch.zeros(self.n, dtype=_F32, device=device)
        self._views = views
        self._ptrs = [(p, p.data_ptr()) for p, _, k in views if k > 0]
        self._ptrs += [(m, name, m._buffers[name].data_ptr())
                       for m, name, _, k in self.buffers if k > 0]

    def params_address(self) -> int:
        return self.flat.data_ptr()

    def check(self):
        """The parameters still live in the registered buffer."""
        for e in self._ptrs:
            if len(e) == 2:
                p, ptr = e
                ok = p.data_ptr() == ptr and p.device == self.device
            else:
                m, name, ptr = e
                b = m._buffers.get(name)
                ok = b is not None and b.data_ptr() == ptr
            if not ok:
                raise WagmaError(
                    Status.EINVAL,
                    "wagma.torch: a parameter or buffer of the model moved out of the registered "
                    "buffer (model.to(), .double(), or assigning .data after wrap?): create the "
                    "model in its final form before job.wrap()")

    def average_gradients(self, worker):
        g = self.grads
        with torch.no_grad():
            g[self.n_grad:].zero_()
            for p, off, k in self._views:
                if p.grad is None:
                    g[off:off + k].zero_()
                elif p.grad.is_sparse:
                    raise WagmaError(Status.EINVAL, "wagma.torch: sparse gradients are not "
                                     "supported")
                else:
                    g[off:off + k].copy_(p.grad.reshape(-1))
            worker.average_gradients(g.data_ptr())
            for p, off, k in self._views:
                if p.grad is not None:
                    p.grad.copy_(g[off:off + k].view_as(p.grad))


# ---------------------------------------------------------------------------------------------
# The optimizer's state as floats


def _payload_len(kind, shape, dtype) -> int:
    if kind == "tensor":
        n = 1
        for s in shape:
            n *= s
        return n * (4 if dtype in _WIDE else 1)
    return {"int": 4, "float": 4, "bool": 1, "none": 0}[kind]


def _kind_of(v, where):
    if v is None:
        return ("none", (), None)
    if isinstance(v, bool):
        return ("bool", (), None)
    if isinstance(v, int):
        return ("int", (), None)
    if isinstance(v, float):
        return ("float", (), None)
    if torch.is_tensor(v):
        if v.is_sparse or not (v.dtype == _F32 or v.dtype in _SMALL or v.dtype in _WIDE):
            raise WagmaError(Status.EINVAL, f"wagma.torch: optimizer state {where}: a "
                             f"{v.dtype} tensor{' (sparse)' if v.is_sparse else ''} cannot be "
                             "sent to a joiner")
        # (a CUDA tensor is copied to and from the library's host buffer by .copy_)
        return ("tensor", tuple(v.shape), v.dtype)
    raise WagmaError(Status.EINVAL, f"wagma.torch: optimizer state {where}: a "
                     f"{type(v).__name__} cannot be sent to a joiner (tensors and numbers only)")


def _encode(kind, dtype, v, out):
    """v into out (a float32 1-D tensor of the payload's length)."""
    if kind == "none":
        return
    if kind == "bool":
        out[0] = 1.0 if v else 0.0
        return
    if kind == "int":
        t, dtype = torch.tensor([v], dtype=torch.int64), torch.int64
    elif kind == "float":
        t, dtype = torch.tensor([v], dtype=torch.float64), torch.float64
    else:
        t = v.detach().reshape(-1)
    if dtype == _F32:
        out.copy_(t)
    elif dtype in _SMALL:
        out.copy_(t.to(_F32))
    else:
        x = t.view(torch.int64) if dtype == torch.float64 else t.to(torch.int64)
        o = out.view(-1, 4)
        for k in range(4):
            o[:, k].copy_(((x >> (16 * k)) & 0xFFFF).to(_F32))


def _decode(kind, shape, dtype, buf):
    """The value in buf (a float32 1-D tensor of the payload's length); tensors are new."""
    if kind == "none":
        return None
    if kind == "bool":
        return bool(buf[0].item() != 0)
    if kind == "int":
        dtype = torch.int64
    elif kind == "float":
        dtype = torch.float64
    if dtype == _F32:
        t = buf.clone()
    elif dtype in _SMALL:
        t = buf.to(dtype)
    else:
        c = buf.view(-1, 4).to(torch.int64)
        x = c[:, 0] | (c[:, 1] << 16) | (c[:, 2] << 32) | (c[:, 3] << 48)
        t = x.view(torch.float64) if dtype == torch.float64 else x.to(dtype)
    if kind == "int":
        return int(t[0].item())
    if kind == "float":
        return float(t[0].item())
    return t.reshape(shape)


class _Slot:
    __slots__ = ("index", "key", "kind", "shape", "dtype", "offset", "length")

    def __init__(self, index, key, kind, shape, dtype, offset):
        self.index, self.key = index, key
        self.kind, self.shape, self.dtype = kind, shape, dtype
        self.offset = offset
        self.length = 1 + _payload_len(kind, shape, dtype)  # flag + payload


class _StateCodec:
    """The state a joiner receives: per optimizer parameter (in param_groups order) its state
    entries (keys sorted), then the model's non-float32 buffers; each a flag and a payload."""

    def __init__(self, optimizer, extra):
        self.opt = optimizer
        self.params = []
        seen = set()
        for g in optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    self.params.append(p)
        self.extra = extra  # [(module, name)]
        self.slots: List[_Slot] = []
        self.n = 0
        self._ignored_logged = False

    # -- layout -----------------------------------------------------------------------------
    def discover(self, flat: _FlatBuffers):
        """Learns the state's layout with one no-op step of the optimizer, then restores the
        optimizer (state, gradients, lr, counters) and the registered memory exactly."""
        opt = self.opt
        saved_state = {p: {k: _copy_value(v) for k, v in s.items()}
                       for p, s in opt.state.items()}
        saved_grads = [(p, p.grad) for p in self.params]
        saved_lr = [(g, g["lr"]) for g in opt.param_groups if "lr" in g]
        saved_attrs = {a: getattr(opt, a) for a in ("_step_count", "_opt_called")
                       if a in opt.__dict__}
        saved_hooks = {a: getattr(opt, a) for a in ("_optimizer_step_pre_hooks",
                                                    "_optimizer_step_post_hooks")
                       if a in opt.__dict__}
        snapshot = flat.flat.clone()
        changed = False
        try:
            for a in saved_hooks:
                setattr(opt, a, OrderedDict())
            for p in self.params:
                p.grad = torch.zeros_like(p)
            for g, lr in saved_lr:
                g["lr"] = torch.zeros_like(lr) if torch.is_tensor(lr) else 0.0
            try:
                type(opt).step(opt)  # the class's step: not the instance's wrappers
            except TypeError:  # an optimizer that needs a closure (LBFGS)
                type(opt).step(opt, lambda: torch.zeros(()))
            slots, off = [], 0
            for i, p in enumerate(self.params):
                s = opt.state.get(p, {})
                for key in sorted(s.keys(), key=str):
                    kind, shape, dtype = _kind_of(s[key], f"{key!r} of parameter {i}")
                    slot = _Slot(i, key, kind, shape, dtype, off)
                    slots.append(slot)
                    off += slot.length
            for j, (m, name) in enumerate(self.extra):
                kind, shape, dtype = _kind_of(m._buffers[name], f"buffer {name!r}")
                slot = _Slot(-1 - j, name, kind, shape, dtype, off)
                slots.append(slot)
                off += slot.length
            extra_keys = [k for k in opt.state.keys() if not any(k is p for p in self.params)]
            if extra_keys:
                log.warning("wagma.torch: optimizer state keyed by something other than a "
                            "parameter is not sent to joiners: %r", extra_keys[:4])
            self.slots, self.n = slots, off
        finally:
            with torch.no_grad():
                changed = not torch.equal(flat.flat, snapshot)
                flat.flat.copy_(snapshot)
            for p, gr in saved_grads:
                p.grad = gr
            for g, lr in saved_lr:
                g["lr"] = lr
            for a, v in saved_attrs.items():
                setattr(opt, a, v)
            for a, v in saved_hooks.items():
                setattr(opt, a, v)
            opt.state.clear()
            for p, s in saved_state.items():
                opt.state[p] = s
        if changed:
            log.debug("wagma.torch: the optimizer's no-op step moved parameters (restored)")

    # -- the state functions ----------------------------------------------------------------
    def size(self) -> int:
        return self.n

    def _entry(self, slot):
        if slot.index >= 0:
            s = self.opt.state.get(self.params[slot.index])
            if s is None or slot.key not in s:
                return _ABSENT, None
            v = s[slot.key]
            return (_NONE, None) if v is None else (_VALUE, v)
        m, name = self.extra[-1 - slot.index]
        v = m._buffers.get(name)
        return (_NONE, None) if v is None else (_VALUE, v)

    def save(self, buf):
        if self.n == 0:
            return
        out = torch.frombuffer(buf, dtype=_F32)
        with torch.no_grad():
            for slot in self.slots:
                flag, v = self._entry(slot)
                o = out[slot.offset:slot.offset + slot.length]
                if flag == _VALUE and slot.kind != "none":
                    kind, shape, dtype = _kind_of(v, f"{slot.key!r}")
                    if (kind, shape, dtype) != (slot.kind, slot.shape, slot.dtype) and not (
                            {kind, slot.kind} <= {"int", "float"}):
                        raise WagmaError(
                            Status.EINVAL,
                            f"wagma.torch: optimizer state {slot.key!r} changed its form since "
                            f"wrap ({slot.kind} {slot.shape} {slot.dtype} -> {kind} {shape} "
                            f"{dtype})")
                    if kind != slot.kind:  # int <-> float counters
                        v = int(v) if slot.kind == "int" else float(v)
                o.zero_()
                o[0] = flag
                if flag == _VALUE:
                    _encode(slot.kind, slot.dtype, v, o[1:])

    def load(self, buf):
        if self.n == 0:
            return
        src = torch.frombuffer(buf, dtype=_F32)
        with torch.no_grad():
            for slot in self.slots:
                o = src[slot.offset:slot.offset + slot.length]
                flag = float(o[0].item())
                if slot.index < 0:
                    m, name = self.extra[-1 - slot.index]
                    b = m._buffers.get(name)
                    if flag == _VALUE and slot.kind == "tensor" and b is not None:
                        b.copy_(_decode(slot.kind, slot.shape, slot.dtype, o[1:]))
                    continue
                p = self.params[slot.index]
                if flag == _ABSENT:
                    s = self.opt.state.get(p)
                    if s is not None:
                        s.pop(slot.key, None)
                        if not s:
                            del self.opt.state[p]
                    continue
                s = self.opt.state[p]
                if flag == _NONE:
                    s[slot.key] = None
                    continue
                v = _decode(slot.kind, slot.shape, slot.dtype, o[1:])
                cur = s.get(slot.key)
                if (torch.is_tensor(v) and torch.is_tensor(cur) and cur.shape == v.shape
                        and cur.dtype == v.dtype):
                    cur.copy_(v)  # in place: whatever holds it sees the survivor's value
                else:
                    s[slot.key] = v.to(p.device) if torch.is_tensor(v) else v


def _copy_value(v):
    return v.detach().clone() if torch.is_tensor(v) else v
