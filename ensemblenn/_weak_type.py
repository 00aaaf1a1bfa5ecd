"""Weak types, which decide dtype promotion, restored on arrays rebuilt from host data."""

from jaxtyping import Array

from . import _jax_private


def weakly_typed(x: Array) -> Array:
    """`x` marked weakly typed, as a value computed from Python scalars is.

    A weakly typed array defers to the other operand's dtype in promotion, so a value saved
    to host memory (numpy has no weak types) and loaded back must be marked again to behave
    as before, e.g. when a checkpoint is restored. JAX has no public spelling for this; if
    the internal one moved, `x` is returned unchanged (only the promotion rule is lost).

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> x = enn.weakly_typed(jnp.ones(3, jnp.float32))
        >>> jax.typeof(x).weak_type, (x + jnp.ones(3, jnp.bfloat16)).dtype
        (True, dtype(bfloat16))
    """
    try:
        return _jax_private.as_weakly_typed(x)
    except Exception:  # noqa: BLE001 - an API change costs only the weak type
        return x
