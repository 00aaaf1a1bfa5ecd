"""The errors `samplers` raises about the user's input: one family under `enn.EnsembleError`.

Example:
    >>> import jax, jax.numpy as jnp, samplers
    >>> try:
    ...     samplers.run("hmc", lambda x: -x @ x, jnp.zeros((4, 2)), key=jax.random.key(0),
    ...                  num_steps=10)
    ... except TypeError as err:
    ...     print(type(err).__name__, isinstance(err, samplers.SamplerError))
    SamplerTypeError True
"""

import ensemblenn as enn


class SamplerError(enn.EnsembleError):
    """Base class of the errors of `samplers` (a `ValueError`, like every `EnsembleError`).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> try:
        ...     samplers.run(samplers.MALA(0.5), lambda x: -x @ x, jnp.zeros((4, 2)),
        ...                  key=jax.random.key(0), num_steps=0)
        ... except samplers.SamplerError as err:
        ...     print(err)
        num_steps must be an int >= 1, got 0.
    """


class SamplerTypeError(SamplerError, enn.EnsembleTypeError):
    """An argument of `samplers` of the wrong type (also a `TypeError`).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> try:
        ...     samplers.run(samplers.MALA(0.5), lambda x: -x @ x, jnp.zeros((4, 2)),
        ...                  key=jax.random.key(0), num_steps=2.5)
        ... except TypeError as err:
        ...     print(type(err).__name__, err)
        SamplerTypeError num_steps must be an int >= 1, got 2.5.
    """


class PrecisionWarning(UserWarning):
    """Emitted by `samplers.run` when float64 positions (numpy float64 arrays) meet JAX's
    default float32 (`jax_enable_x64` off): JAX converts them, so the run samples in
    float32. The message names the leaf; the fix is
    `jax.config.update("jax_enable_x64", True)` before creating any arrays (to sample in
    float64), or float32 positions (to say float32 is meant).

    Example:
        >>> import warnings, jax, numpy as np, samplers
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     _ = samplers.run(samplers.MALA(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                      np.zeros((8, 2)), key=jax.random.key(0), num_steps=2,
        ...                      progress=False)
        >>> print(next(w for w in seen if w.category is samplers.PrecisionWarning).message)
        ... # doctest: +ELLIPSIS
        positions has dtype float64, but jax_enable_x64 is off: it is sampled in float32...
    """


# Shown by their public names in tracebacks and on the docs pages.
for _public in (SamplerError, SamplerTypeError, PrecisionWarning):
    _public.__module__ = "samplers"
