"""MEADS: tuned hyperparameters and positions bitwise identical on 1, 2 and 4 devices.

Each device count runs in a fresh process (tests/programs/meads_invariance.py). The fold
estimates divide many means by the same broadcast fold share; XLA rewrote those divisions
one way on one device (`x * (1 / share)`) and another on several (CSE, which runs only when
partitioning, merges the broadcasts, and `(a / b) / c` becomes `a / (b * c)`), so before
`_fold_estimates` kept its divisions as written (`enn.exact_divisions`) the tuned
step sizes and inverse mass matrices differed in the last bits, and the positions by 3e-5.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROGRAM = Path(__file__).parent / "programs" / "meads_invariance.py"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meads_invariance")
    procs = {
        n: subprocess.Popen([sys.executable, str(PROGRAM), str(n), str(folder / f"{n}.npz")])
        for n in (1, 2, 4)
    }
    for n, proc in procs.items():
        assert proc.wait(timeout=600) == 0, f"program failed on {n} devices"
    return {n: dict(np.load(folder / f"{n}.npz")) for n in procs}


@pytest.mark.parametrize("n", [2, 4])
def test_meads_is_bitwise_identical_across_device_counts(outputs, n):
    names = sorted(outputs[1], key=lambda k: int(k.split("_")[1]))  # arr_0, arr_1, ...
    assert len(names) == 4  # step size, damping, inverse mass matrix, positions
    assert outputs[1][names[-1]].shape == (32, 20)
    assert np.all(np.isfinite(outputs[1][names[-1]]))
    for name in names:
        np.testing.assert_array_equal(outputs[n][name], outputs[1][name], err_msg=name)
