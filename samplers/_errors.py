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
