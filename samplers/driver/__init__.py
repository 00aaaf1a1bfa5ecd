"""The driver: `run` = validate -> prepare (init, adaptation) -> chunk loop -> finalise,
with the streaming moments, the result and the progress bar beside it.

Following a parameter from `samplers.run` to the `shard_map`: `_run.run` checks every option
once into a `_options.RunOptions`, `_setup.make_setup` keeps it in the `Setup`, and
`_prepare.prepare` / `_loop.chunk_loop` pass `setup.mapping` (its mesh, axis and block size)
to `enn.ensemble_map`, which partitions the operands and calls
`jax.shard_map` (`ensemblenn/_ensemble_map.py`).

Pytree positions are raveled ONCE, at this boundary (`_flat.py`): `run` turns the user's
positions (any pytree of floating arrays with a leading chain axis) into `(num_chains,
dim)` vectors and the log density of one chain's pytree into one of a flat vector
(`FlatTarget`, which keeps the user's callable as a field so the closure guard still sees
its arrays). Kernels, adaptations, metrics, moments and checkpoints are flat-vector code;
`_finalise` unravels the final state, the traces and the diagnostics into the user's
structures (the observable's for `Result.diagnostics`/`trace`, the position's for
`Result.unconstrained`). A plain `(num_chains, dim)` array is not wrapped at all.
"""

from ._flat import PositionsError
from ._moments import ChainMoments
from ._result import Diagnostics, Result, Unconstrained
from ._run import run
from ._verdict import ConvergenceWarning, Verdict, verdict_of

__all__ = [
    "ChainMoments",
    "ConvergenceWarning",
    "Diagnostics",
    "PositionsError",
    "Result",
    "Unconstrained",
    "Verdict",
    "run",
    "verdict_of",
]
