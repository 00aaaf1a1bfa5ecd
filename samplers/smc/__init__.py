"""Sequential Monte Carlo over sharded particles.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from samplers import smc
    >>> smc.ancestors(jax.random.key(0), jnp.log(jnp.array([0.5, 0.5]))).tolist()
    [0, 1]
"""

from ._resampling import SCHEMES, ancestors, resample

__all__ = ["SCHEMES", "ancestors", "resample"]
