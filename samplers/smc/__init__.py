"""Sequential Monte Carlo over sharded particles.

`SMC` (also `samplers.SMC`) runs adaptive tempered SMC with resample-move and returns an
`SMCResult` with the log evidence; `ancestors` and `resample` are its resampling, usable
on their own inside an `enn.ensemble_map` body.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from samplers import smc
    >>> smc.ancestors(jax.random.key(0), jnp.log(jnp.array([0.5, 0.5]))).tolist()
    [0, 1]
"""

from ._resampling import SCHEMES, ancestors, resample
from ._result import SMCResult
from ._smc import SMC

__all__ = ["SCHEMES", "SMC", "SMCResult", "ancestors", "resample"]
