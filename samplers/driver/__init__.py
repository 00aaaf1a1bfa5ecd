"""The driver: `run` = validate -> prepare (init, adaptation) -> chunk loop -> finalise,
with the streaming moments, the result and the progress bar beside it.

Following a parameter from `samplers.run` to the `shard_map`: `_run.run` resolves it in
`_setup.make_setup` (a `Setup`), `_prepare.prepare` / `_loop.chunk_loop` pass
`setup.mapping` to `enn.ensemble_map`, which partitions the operands and calls
`jax.shard_map` (`ensemblenn/_ensemble_map.py`).
"""

from ._moments import ChainMoments
from ._result import Diagnostics, Result
from ._run import run
from ._verdict import ConvergenceWarning, Verdict

__all__ = ["ChainMoments", "ConvergenceWarning", "Diagnostics", "Result", "Verdict", "run"]
