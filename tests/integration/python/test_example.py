#!/usr/bin/python3
"""examples/pytorch/fmnist_cnn.py as the agent would launch it, on the stub library: a short
job to its end (trains, evaluates, exit 0), a job the agent stops (exit 0, no evaluation) and a
job that counts epochs. Exits 77 without torch or without Debian's dataset-fashion-mnist."""

import os
import re
import subprocess
import sys
import unittest

import _support

_support.setup()
_support.require_torch()

EXAMPLE = os.path.join(_support.SOURCE_DIR, "examples", "pytorch", "fmnist_cnn.py")
DATA = "/usr/share/datasets/fashion-mnist"
if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
    print(f"skipped: no Fashion-MNIST in {DATA} (Debian's dataset-fashion-mnist)")
    sys.exit(_support.SKIP)


def run(args=(), **stub):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAGMA_STUB_")}
    env.update({f"WAGMA_STUB_{k}": str(v) for k, v in stub.items()})
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run([EXAMPLE, *args], env=env, capture_output=True, text=True, timeout=100)
    return r.returncode, r.stdout, r.stderr


class ExampleTest(unittest.TestCase):
    def test_executable(self):
        self.assertTrue(os.access(EXAMPLE, os.X_OK))
        with open(EXAMPLE) as f:
            self.assertEqual(f.readline().strip(), "#!/usr/bin/python3")

    def test_trains_to_the_end(self):
        rc, out, err = run(["--log-every", "20", "--lr", "0.05"], ITERATIONS=60)
        self.assertEqual(rc, 0, err)
        self.assertEqual(re.findall(r"^step (\d+) ", out, re.M), ["0", "20", "40"])
        m = re.search(r"^test loss ([\d.]+) accuracy ([\d.]+)", out, re.M)
        self.assertIsNotNone(m, out)
        self.assertGreater(float(m.group(2)), 0.3)  # 60 iterations of batch 32: well above 0.1

    def test_stopped_by_the_agent(self):
        rc, out, err = run(["--log-every", "1"], ITERATIONS=100, STOP_AT=3)
        self.assertEqual(rc, 0, err)
        self.assertEqual(re.findall(r"^step (\d+) ", out, re.M), ["0", "1", "2"])
        self.assertNotIn("test loss", out)

    def test_epochs(self):
        # ceil(1 epoch x 60000 samples / (batch 100 x 300 workers)) = 2 iterations
        rc, out, err = run(["--log-every", "1", "--batch-size", "100"], ITERATIONS=0, EPOCHS=1,
                           WORKERS=300)
        self.assertEqual(rc, 0, err)
        self.assertEqual(re.findall(r"^step (\d+) ", out, re.M), ["0", "1"])
        self.assertIn("test loss", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
