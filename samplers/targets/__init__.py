"""Targets: standard ones with known moments (for tests and benchmarks), and users' models
(`from_numpyro`).

A target is an equinox Module and a log density: `target(x)` is the log density of ONE
position `x` of shape `(dim,)`, so it can be passed wherever a `logdensity` is expected.
Its data (covariances, regression data, reference moments) are `enn.broadcast()` fields,
so an ensemble of chains shares one replicated copy and nothing is captured by closure.

`target.reference` holds the exact (or precomputed) moments `E[x]`, `E[x²]` and `Var[x²]`
of `target.observable(x)` (the position itself, except for `NealsFunnel`), which is what
`samplers.diagnostics.bias_squared` compares against.

Example:
    >>> import jax, jax.numpy as jnp, samplers
    >>> target = samplers.targets.Banana()
    >>> x = jax.vmap(target.sample)(jax.random.split(jax.random.key(0), 4))
    >>> jax.vmap(target)(x).shape
    (4,)
"""

from ._numpyro import NumPyroTarget, from_numpyro
from ._standard import (
    Banana,
    BimodalGaussian,
    IllConditionedGaussian,
    LogisticRegression,
    Moments,
    NealsFunnel,
    Rosenbrock,
    Target,
)

__all__ = [
    "Banana",
    "BimodalGaussian",
    "IllConditionedGaussian",
    "LogisticRegression",
    "Moments",
    "NealsFunnel",
    "NumPyroTarget",
    "Rosenbrock",
    "Target",
    "from_numpyro",
]
