"""The convergence plot the command line writes (matplotlib optional)."""

import os
from typing import Any

import numpy as np


def convergence_plot(result: Any, path: str | os.PathLike, title: str = "") -> str | None:
    """Save a PNG of the run's convergence: b² of the second moments per sampling step (if
    the run tracked it) and R-hat / nested R-hat per dimension.

    Returns:
        None when the plot was written, else a note saying why not (matplotlib missing).

    Example:
        >>> import tempfile, os, jax, jax.numpy as jnp, samplers
        >>> from samplers._plots import convergence_plot
        >>> target = samplers.targets.IllConditionedGaussian(dim=2, condition_number=2.0)
        >>> result = samplers.run(samplers.MALA(step_size=0.5), target, jnp.zeros((8, 2)),
        ...                       key=jax.random.key(0), num_steps=20, track_bias=True,
        ...                       progress=False)
        >>> path = os.path.join(tempfile.mkdtemp(), "convergence.png")
        >>> convergence_plot(result, path) is None and os.path.getsize(path) > 0
        True
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed, so no convergence plot (pip install matplotlib)"
    import ensemblenn as enn

    d = result.diagnostics
    host = enn.distributed.gather(
        {"bias": result.bias_history, "rhat": d.rhat, "nested": d.nested_rhat}
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if host["bias"] is not None and len(host["bias"]):
        steps = np.arange(1, len(host["bias"]) + 1)
        left.loglog(steps, host["bias"][:, 0], label="max over dimensions")
        left.loglog(steps, host["bias"][:, 1], label="mean over dimensions")
        left.axhline(0.01, color="gray", ls="--", lw=1, label="0.01 (about 100 eff. samples)")
        left.set_xlabel("sampling step")
        left.set_ylabel("b² of E[x²]")
        left.legend(fontsize=8)
    else:
        left.text(
            0.5,
            0.5,
            "b² not tracked\n(run with track_bias=True and a reference)",
            ha="center",
            va="center",
            transform=left.transAxes,
        )
        left.set_axis_off()
    dims = np.arange(len(host["rhat"]))
    right.plot(dims, host["rhat"], "o", ms=3, label="split R-hat")
    if host["nested"] is not None:
        right.plot(dims, host["nested"], "x", ms=4, label="nested R-hat")
    right.axhline(1.01, color="gray", ls="--", lw=1, label="1.01")
    right.set_xlabel("dimension")
    right.set_ylabel("R-hat")
    right.legend(fontsize=8)
    fig.suptitle(title or f"{result.num_chains} chains, {result.num_steps} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
