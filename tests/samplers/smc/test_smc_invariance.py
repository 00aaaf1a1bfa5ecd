"""A whole SMC run is bitwise the same on 1, 2, 4 and 8 devices (block_size="auto")."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

PROGRAM = Path(__file__).parents[2] / "programs" / "smc_invariance.py"


@pytest.mark.slow
def test_smc_run_is_bitwise_identical_on_1_2_4_8_devices(tmp_path):
    # The four device counts at once (each process compiles its own programs).
    runs = {
        n: subprocess.Popen([sys.executable, str(PROGRAM), str(n), str(tmp_path / f"{n}.npz")])
        for n in (1, 2, 4, 8)
    }
    for n, process in runs.items():
        assert process.wait(timeout=300) == 0, f"{n} devices failed"
    out = {n: np.load(tmp_path / f"{n}.npz") for n in runs}
    assert out[1]["temperatures"].size > 3  # several stages, with their tuning
    assert out[1]["mutation_steps"].max() > 2  # and rounds of moves until decorrelated
    for n in (2, 4, 8):
        for name in out[1].files:
            np.testing.assert_array_equal(out[n][name], out[1][name], err_msg=f"{name}, {n}")
