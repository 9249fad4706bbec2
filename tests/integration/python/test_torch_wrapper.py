#!/usr/bin/python3
"""wagma.torch (python/wagma/torch.py) on the stub library: the flat buffer and its views, the
no-op materialisation of the optimizer's state (the optimizer still behaves as a fresh one),
the state's exact round trip to a joiner (at register and inside a step), allreduce's gradient
path, epochs, the agent's stop, finish, and the checks. Exits 77 without torch."""

import ctypes
import os
import tempfile
import unittest
import warnings

import _support

_support.setup()
_support.require_torch()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import wagma  # noqa: E402
import wagma.torch  # noqa: E402
from _support import stub_env, stub_stats  # noqa: E402
from wagma import Status, WagmaError  # noqa: E402

torch.set_num_threads(1)
TMP = tempfile.TemporaryDirectory(prefix="wagma-test-torch-")


class Net(nn.Module):
    """Parameters, float32 buffers (BatchNorm's running statistics) and an int64 buffer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


def batches(n, seed=123):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 1, 6, 6, generator=g), torch.randint(5, (8,), generator=g))
            for _ in range(n)]


def train_step(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def model_from(seed):
    torch.manual_seed(seed)
    return Net()


def same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def same_state(oa, ob):
    """The optimizers' states: the same entries, values equal (tensors: dtype and values)."""
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    if sa.keys() != sb.keys():
        return False
    for k in sa:
        if sa[k].keys() != sb[k].keys():
            return False
        for key in sa[k]:
            va, vb = sa[k][key], sb[k][key]
            if torch.is_tensor(va) != torch.is_tensor(vb):
                return False
            if torch.is_tensor(va):
                if va.dtype != vb.dtype or not torch.equal(va, vb):
                    return False
            elif va != vb:
                return False
    return True


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.3,
                                               weight_decay=1e-3),
    "sgd-nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "sgd-plain": lambda p: torch.optim.SGD(p, lr=0.05),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


def open_job(**stub):
    stub.setdefault("ITERATIONS", 1000)
    with stub_env(**stub):
        return wagma.torch.init()


class FlatBufferTest(unittest.TestCase):
    def test_views_and_stable_addresses(self):
        job = open_job(ITERATIONS=12)
        model = model_from(0)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        self.assertIs(job.wrap(opt, model), opt)
        self.assertTrue(same_model(model, model_from(0)))  # wrap changed no value
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        flat = job._flat.flat
        base, esz = flat.data_ptr(), flat.element_size()
        # parameters, then the float32 buffers, back to back in the one flat tensor
        tensors = list(model.parameters()) + [model.bn.running_mean, model.bn.running_var]
        off = 0
        for t in tensors:
            self.assertEqual(t.data_ptr(), base + off * esz)
            off += t.numel()
        self.assertEqual(off, flat.numel())
        self.assertEqual(job._flat.n_grad, sum(p.numel() for p in model.parameters()))
        self.assertEqual(job._flat.grads.numel(), flat.numel())  # the registered length
        ptrs = [t.data_ptr() for t in tensors]
        data = batches(12)
        for step in job.loop():
            train_step(model, opt, data[step])
        self.assertEqual(job.iteration, 12)
        self.assertEqual([t.data_ptr() for t in tensors], ptrs)
        self.assertEqual(flat.data_ptr(), base)
        self.assertFalse(torch.equal(model.fc.weight, model_from(0).fc.weight))  # it trained
        self.assertEqual(int(model.bn.num_batches_tracked), 12)
        # writing the flat buffer (as the library does) is writing the model
        with torch.no_grad():
            flat.fill_(0.25)
        self.assertTrue(all(bool((t == 0.25).all()) for t in tensors))
        job.close()

    def test_model_moved_after_wrap(self):
        job = open_job()
        model = model_from(0)
        opt = job.wrap(torch.optim.SGD(model.parameters(), lr=0.1), model)
        model.fc.weight.data = model.fc.weight.data.clone()
        with self.assertRaises(WagmaError) as c:
            train_step(model, opt, batches(1)[0])
        self.assertEqual(c.exception.status, Status.EINVAL)
        self.assertIn("moved out of the registered buffer", c.exception.message)
        job.close()

    def test_refused(self):
        job = open_job()
        with self.assertRaises(WagmaError) as c:  # a device that is neither the CPU nor CUDA
            m = nn.Linear(4, 2, device="meta")
            job.wrap(torch.optim.SGD(m.parameters(), lr=0.1), m)
        self.assertEqual(c.exception.status, Status.ENOSYS)
        self.assertIn("CPU and CUDA models only", c.exception.message)
        with self.assertRaises(WagmaError) as c:  # a model over two devices
            m = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2, device="meta"))
            job.wrap(torch.optim.SGD(m.parameters(), lr=0.1), m)
        self.assertIn("on one device", c.exception.message)
        with self.assertRaises(WagmaError) as c:
            m = nn.Linear(4, 2).double()
            job.wrap(torch.optim.SGD(m.parameters(), lr=0.1), m)
        self.assertIn("float32 models only", c.exception.message)
        with self.assertRaises(WagmaError) as c:
            m, other = nn.Linear(4, 2), nn.Linear(2, 2)
            job.wrap(torch.optim.SGD(list(m.parameters()) + list(other.parameters()), lr=0.1), m)
        self.assertIn("not the model's", c.exception.message)
        m = nn.Linear(4, 2)
        opt = job.wrap(torch.optim.SGD(m.parameters(), lr=0.1))  # no model: the optimizer's
        with self.assertRaises(WagmaError) as c:
            job.wrap(opt, m)
        self.assertIn("called twice", c.exception.message)
        job.close()


class MaterialisationTest(unittest.TestCase):
    """wrap's no-op step changes nothing: the wrapped optimizer steps exactly as a fresh one."""

    def check(self, name, make, pre_steps=0):
        job = open_job()
        data = batches(pre_steps + 6)
        a, b = model_from(0), model_from(0)
        oa, ob = make(a.parameters()), make(b.parameters())
        for i in range(pre_steps):  # an optimizer that stepped before wrap keeps its state
            train_step(a, oa, data[i])
            train_step(b, ob, data[i])
        n_state = len(oa.state)
        job.wrap(oa, a)
        self.assertTrue(same_model(a, b), name)
        self.assertEqual(len(oa.state), n_state, name)
        self.assertTrue(same_state(oa, ob), name)
        self.assertTrue(all(p.grad is None for p in a.parameters()) if pre_steps == 0 else True)
        for i in range(pre_steps, pre_steps + 6):
            la, lb = train_step(a, oa, data[i]), train_step(b, ob, data[i])
            self.assertTrue(torch.equal(la, lb), f"{name} step {i}")
            self.assertTrue(same_model(a, b), f"{name} step {i}")
            self.assertTrue(same_state(oa, ob), f"{name} step {i}")
        size = job._state.size()
        job.close()
        return size

    def test_fresh_optimizers(self):
        for name, make in OPTIMIZERS.items():
            with self.subTest(name):
                self.check(name, make)

    def test_same_length_fresh_or_stepped(self):
        """Every member sends the same state length, whether its optimizer stepped or not."""
        for name in ("sgd-momentum", "adam-amsgrad", "rmsprop"):
            with self.subTest(name):
                fresh = self.check(name, OPTIMIZERS[name])
                stepped = self.check(name, OPTIMIZERS[name], pre_steps=2)
                self.assertEqual(fresh, stepped)
                self.assertGreater(fresh, 0)

    def test_lr_scheduler_and_hooks_untouched(self):
        job = open_job()
        a = model_from(0)
        oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(oa, step_size=2, gamma=0.5)
        count = getattr(oa, "_step_count", None)
        job.wrap(oa, a)
        self.assertEqual(getattr(oa, "_step_count", None), count)
        self.assertEqual(oa.param_groups[0]["lr"], 0.1)
        data = batches(4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "optimizer.step() has been overridden"
            for i in range(4):
                train_step(a, oa, data[i])
                sched.step()
        self.assertAlmostEqual(oa.param_groups[0]["lr"], 0.025)
        job.close()

    def test_lr_scheduler_after_wrap(self):
        job = open_job()
        a = model_from(0)
        oa = job.wrap(torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9), a)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sched = torch.optim.lr_scheduler.StepLR(oa, step_size=2, gamma=0.5)
            data = batches(4)
            for i in range(4):
                train_step(a, oa, data[i])
                sched.step()
        self.assertAlmostEqual(oa.param_groups[0]["lr"], 0.025)
        self.assertEqual(job.iteration, 4)
        job.close()


class JoinerTest(unittest.TestCase):
    """A survivor's parameters and optimizer state reach a joiner exactly (the stub's file
    stands for the wire): the joiner's next steps equal the survivor's, bit for bit."""

    def run_join(self, name, make, join_at=0):
        path = os.path.join(TMP.name, f"join-{name}-{join_at}")
        data = batches(12)
        job_a = open_job(SAVE_TO=path, SAVE_AT=4)
        a = model_from(0)
        oa = job_a.wrap(make(a.parameters()), a)
        for i in range(4):
            train_step(a, oa, data[i])
        self.assertEqual(job_a.iteration, 4)

        if join_at:  # a member that trained on its own, then joins inside a step
            job_b = open_job(JOIN_FROM=path, JOIN_AT=join_at)
        else:  # a joiner: replaced inside wrap (register)
            job_b = open_job(JOIN_FROM=path)
        b = model_from(1)  # another initial model: the survivor's replaces it
        ob = job_b.wrap(make(b.parameters()), b)
        if join_at:
            self.assertFalse(job_b.joined)
            other = batches(join_at, seed=99)
            for i in range(join_at):
                train_step(b, ob, other[i])
        self.assertTrue(job_b.joined)
        self.assertEqual(job_b.iteration, 4)
        self.assertTrue(same_model(a, b), name)  # BatchNorm's counter (int64) included
        self.assertTrue(same_state(oa, ob), name)
        for i in range(4, 12):
            train_step(a, oa, data[i])
            train_step(b, ob, data[i])
            self.assertTrue(same_model(a, b), f"{name} step {i}")
        self.assertTrue(same_state(oa, ob), name)
        job_a.close()
        job_b.close()

    def test_join_at_register(self):
        for name in ("sgd-momentum", "sgd-dampening", "adam-amsgrad", "rmsprop", "adagrad"):
            with self.subTest(name):
                self.run_join(name, OPTIMIZERS[name])

    def test_join_inside_a_step(self):
        for name in ("sgd-nesterov", "adamw"):
            with self.subTest(name):
                self.run_join(name, OPTIMIZERS[name], join_at=2)

    def test_fresh_survivor_keeps_the_joiner_fresh(self):
        """The state of an optimizer that never stepped: every entry absent. Loaded into one
        that stepped, it empties it: it then steps as a fresh one (SGD's dampening shows it)."""
        make = OPTIMIZERS["sgd-dampening"]
        job_a, job_b = open_job(), open_job()
        a, b, c = model_from(0), model_from(0), model_from(0)
        job_a.wrap(make(a.parameters()), a)
        ob, oc = make(b.parameters()), make(c.parameters())
        train_step(b, ob, batches(1, seed=5)[0])
        ob = job_b.wrap(ob, b)
        n = job_a._state.size()
        self.assertEqual(n, job_b._state.size())
        buf = (ctypes.c_float * n)()
        job_a._state.save(buf)
        job_b._state.load(buf)
        self.assertEqual(len(ob.state), 0)
        b.load_state_dict(c.state_dict())  # in place: the views stay
        job_b._flat.check()
        for batch in batches(3):
            train_step(b, ob, batch)
            train_step(c, oc, batch)
            self.assertTrue(same_model(b, c))
        job_a.close()
        job_b.close()

    def test_exact_encoding(self):
        """Every kind of value an optimizer may keep crosses exactly."""

        class Odd(torch.optim.Optimizer):
            def __init__(self, params):
                super().__init__(params, dict(lr=0.1))

            @torch.no_grad()
            def step(self, closure=None):
                for g in self.param_groups:
                    for p in g["params"]:
                        s = self.state[p]
                        if not s:
                            s["f64"] = torch.zeros(3, dtype=torch.float64)
                            s["i64"] = torch.zeros(2, dtype=torch.int64)
                            s["i32"] = torch.zeros(2, dtype=torch.int32)
                            s["f16"] = torch.zeros(2, dtype=torch.float16)
                            s["bool"] = torch.zeros(2, dtype=torch.bool)
                            s["count"] = 0
                            s["ratio"] = 0.0
                            s["flag"] = False
                            s["nothing"] = None
                            s["scalar"] = torch.tensor(0.0)
                        s["f64"] += torch.tensor([1 / 3, -1e300, 5e-324], dtype=torch.float64)
                        s["i64"] += torch.tensor([-(2 ** 62) - 5, 2 ** 53 + 1])
                        s["i32"] += torch.tensor([-(2 ** 31), 2 ** 31 - 1], dtype=torch.int32)
                        s["f16"] += torch.tensor([0.1, -65504], dtype=torch.float16)
                        s["bool"] |= torch.tensor([True, False])
                        s["count"] += 2 ** 40 + 3
                        s["ratio"] += 1 / 7
                        s["flag"] = True
                        s["scalar"] += 1.5

        job_a, job_b = open_job(), open_job()
        a, b = model_from(0), model_from(0)
        oa, ob = job_a.wrap(Odd(a.parameters()), a), job_b.wrap(Odd(b.parameters()), b)
        for batch in batches(2):
            train_step(a, oa, batch)
        with torch.no_grad():
            a.bn.num_batches_tracked.fill_(2 ** 40 + 7)
        n = job_a._state.size()
        buf = (ctypes.c_float * n)()
        job_a._state.save(buf)
        job_b._state.load(buf)
        self.assertTrue(same_state(oa, ob))
        for p in b.parameters():
            self.assertIs(ob.state[p]["nothing"], None)
            self.assertEqual(type(ob.state[p]["count"]), int)
            self.assertEqual(ob.state[p]["count"], 2 * (2 ** 40 + 3))
            self.assertEqual(ob.state[p]["ratio"], 2 / 7)
            self.assertIs(ob.state[p]["flag"], True)
        self.assertEqual(int(b.bn.num_batches_tracked), 2 ** 40 + 7)
        self.assertTrue(all(v == v for v in buf))  # never a NaN pattern on the wire
        job_a.close()
        job_b.close()


class JobTest(unittest.TestCase):
    def test_allreduce_averages_the_gradients(self):
        """The stub's "average" halves the gradients: SGD at lr 0.25 then steps as SGD at
        0.125 without wagma, exactly (powers of two)."""
        job = open_job(ALGORITHM="allreduce", GRAD_SCALE=0.5, ITERATIONS=5)
        a, b = model_from(0), model_from(0)
        oa = job.wrap(torch.optim.SGD(a.parameters(), lr=0.25), a)
        ob = torch.optim.SGD(b.parameters(), lr=0.125)
        data = batches(5)
        for step in job.loop():
            train_step(a, oa, data[step])
            train_step(b, ob, data[step])
            self.assertTrue(same_model(a, b))
            for pa, pb in zip(a.parameters(), b.parameters()):
                self.assertTrue(torch.equal(pa.grad * 2, pb.grad))
        self.assertEqual(stub_stats(job.worker)[0][:2], (5, 5))
        with self.assertRaises(WagmaError) as c:
            oa.step(lambda: 0.0)
        self.assertIn("step(closure) is not supported", c.exception.message)
        job.close()

    def test_wagma_does_not_touch_gradients(self):
        job = open_job(ALGORITHM="wagma", GRAD_SCALE=0.5, ITERATIONS=3)
        a = model_from(0)
        oa = job.wrap(torch.optim.SGD(a.parameters(), lr=0.25), a)
        for step in job.loop():
            train_step(a, oa, batches(3)[step])
        self.assertEqual(stub_stats(job.worker)[0][:2], (0, 3))
        job.close()

    def test_epochs(self):
        job = open_job(ITERATIONS=0, EPOCHS=2, BATCH=32, WORKERS=4)
        a = model_from(0)
        with self.assertRaises(WagmaError) as c:
            job.wrap(torch.optim.SGD(a.parameters(), lr=0.1), a)
        self.assertEqual(c.exception.status, Status.EINVAL)
        self.assertIn("samples=", c.exception.message)
        job.close()
        with stub_env(ITERATIONS=0, EPOCHS=2, BATCH=32, WORKERS=4):
            job = wagma.torch.init(samples=1000)
        opt = job.wrap(torch.optim.SGD(a.parameters(), lr=0.1), a)
        self.assertEqual(job.iterations, 16)  # ceil(2 x 1000 / (32 x 4))
        steps = 0
        for _ in job.loop():
            opt.step()
            steps += 1
        self.assertEqual(steps, 16)
        self.assertEqual(stub_stats(job.worker)[0][6], 1)
        job.close()
        job = open_job(ITERATIONS=0, EPOCHS=2, BATCH=32, WORKERS=4)
        job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1), samples=1000,
                 batch_size=50)
        self.assertEqual(job.iterations, 10)
        job.close()
        job = open_job(ITERATIONS=7, EPOCHS=0)  # the spec's iterations win
        job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1), samples=1000)
        self.assertEqual(job.iterations, 7)
        self.assertEqual(stub_stats(job.worker)[0][6], 0)
        job.close()

    def test_finish(self):
        job = open_job(ITERATIONS=3)
        a = model_from(0)
        opt = job.wrap(torch.optim.SGD(a.parameters(), lr=0.1), a)
        for step in job.loop():
            job.report(train_step(a, opt, batches(3)[step]))
        self.assertEqual(stub_stats(job.worker)[0][2], 3)
        seen = []
        r = job.finish(lambda m: seen.append(m) or (torch.tensor(0.5), 0.75))
        self.assertIs(seen[0], a)
        self.assertEqual(r[1], 0.75)
        counts, last = stub_stats()
        self.assertEqual((counts[3], counts[4], counts[5]), (1, 0, 1))  # done, fail, final
        self.assertEqual(last, (0.5, 0.75))
        job.close()  # idempotent

        job = open_job(ITERATIONS=1)
        opt = job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1))
        for _ in job.loop():
            opt.step()
        self.assertEqual(job.finish(lambda m: 0.5), 0.5)  # an accuracy alone
        counts, last = stub_stats()
        self.assertEqual(last[1], 0.5)
        self.assertNotEqual(last[0], last[0])

        job = open_job(ITERATIONS=1)
        job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1))

        def bad(m):
            raise ValueError("no test set")

        with self.assertRaises(ValueError):
            job.finish(bad)
        counts, _ = stub_stats()
        self.assertEqual((counts[3], counts[4]), (0, 1))  # failed, not done

    def test_stopped_by_the_agent(self):
        job = open_job(ITERATIONS=10, STOP_AT=3)
        a = model_from(0)
        opt = job.wrap(torch.optim.SGD(a.parameters(), lr=0.1), a)
        steps = []
        for s in job.loop():
            steps.append(s)
            opt.step()
        self.assertEqual(steps, [0, 1, 2])
        self.assertTrue(job.stopped)
        train_step(a, opt, batches(1)[0])  # step's ECANCELED is no exception
        called = []
        with self.assertRaises(wagma.torch.Stopped) as c:
            job.finish(lambda m: called.append(1))
        self.assertEqual(c.exception.code, 0)
        self.assertIsInstance(c.exception, SystemExit)
        self.assertEqual(called, [])
        self.assertEqual(stub_stats()[0][3], 0)  # no done

        job = open_job(ITERATIONS=2, FINAL_CANCELED=1)
        opt = job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1))
        for _ in job.loop():
            opt.step()
        self.assertFalse(job.stopped)
        with self.assertRaises(wagma.torch.Stopped):
            job.finish(lambda m: called.append(1))
        self.assertEqual(called, [])

    def test_seeds_and_status(self):
        job = open_job(SEED=1234, RANK=1, AGENT="a1", WORKERS=4)
        x = torch.rand(3)
        torch.manual_seed(1234)
        self.assertTrue(torch.equal(x, torch.rand(3)))  # init seeded torch with the job's seed
        self.assertEqual(job.seed, 1234)
        self.assertEqual((job.rank, job.size, job.epoch), (-1, 0, 0))
        job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1))
        after_1 = torch.rand(3)
        self.assertEqual((job.rank, job.size, job.epoch, job.iteration), (1, 4, 1, 0))
        self.assertEqual((job.workers, job.batch_size, job.algorithm), (4, 32, "wagma"))
        for _ in range(2):
            job.optimizer.step()
        self.assertEqual((job.iteration, job.group, job.staleness), (2, (1, 2), 2))
        job.close()
        draws = []
        for rank, agent in ((1, "a1"), (2, "a2"), (1, "a1")):
            job = open_job(SEED=1234, RANK=rank, AGENT=agent)
            job.wrap(torch.optim.SGD(model_from(0).parameters(), lr=0.1))
            draws.append(torch.rand(3))
            job.close()
        self.assertTrue(torch.equal(draws[0], after_1))
        self.assertFalse(torch.equal(draws[0], draws[1]))  # members draw different batches
        self.assertTrue(torch.equal(draws[0], draws[2]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
