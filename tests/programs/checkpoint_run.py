"""A checkpointed `samplers.run` in a fresh process, for tests/test_checkpoint.py.

Usage: python checkpoint_run.py NUM_DEVICES CHECKPOINT_DIR MODE [OUT.npz]

MODE "kill": run with checkpoints (RUN["checkpoint_every"]), and on the second save (the
final one) stop with the new file written but not yet renamed over the old one, print
MIDWRITE and sleep, so that the test can SIGKILL the process mid-save. MODE "resume":
resume from CHECKPOINT_DIR, finish the run and save its outcome to OUT.npz. The run's
configuration is `RUN` in tests/samplers/checkpoint/test_checkpoint.py.
"""

import os
import sys
import time

num_devices, folder, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "samplers", "checkpoint"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # `tests.` helpers
from test_checkpoint import RUN, make_run  # noqa: E402

from tests.interrupt import before_rename  # noqa: E402

assert jax.device_count() == num_devices
sampler, target, positions, kwargs = make_run()

if mode == "kill":
    saves = []

    def pause(path):
        saves.append(path)
        if len(saves) == 2:  # the first save (at the halfway step) completed before
            print("MIDWRITE", path, flush=True)
            time.sleep(600)

    os.replace = before_rename(pause)  # the new file written, the old one still in place
    samplers.run(
        sampler,
        target,
        positions,
        checkpoint_dir=folder,
        checkpoint_every=RUN["checkpoint_every"],
        **kwargs,
    )
    raise SystemExit("the run finished: it should have been killed mid-write")

result = samplers.run(sampler, target, positions, checkpoint_dir=folder, resume=True, **kwargs)
np.savez(
    sys.argv[4],
    position=np.asarray(result.state.position),
    mean=np.asarray(result.moments.mean),
    m2=np.asarray(result.moments.m2),
    second=np.asarray(result.moments.second_moment),
    trace=np.asarray(result.trace),
    bias=np.asarray(result.bias_history),
    acceptance=np.asarray(result.acceptance_rate),
    rhat=np.asarray(result.diagnostics.rhat),
    ess=np.asarray(result.diagnostics.ess),
)
print("done; final checkpoint at step", samplers.checkpoint.inspect(folder)["step"], flush=True)
