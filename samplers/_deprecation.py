"""One release of grace for calls written in the old key-first order.

Every public function and method of `samplers` that takes a PRNG key now takes it LAST,
like `Sampler.init(logdensity, position, key)` and `Sampler.step(logdensity, state, key)`.
"""

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _is_key(x: Any) -> bool:
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return True
    return getattr(x, "dtype", None) == jnp.uint32 and np.shape(x) == (2,)


def key_last(name: str, args: tuple, key: Any) -> tuple[tuple, Any]:
    """`(args, key)` in the key-last order, for a call that may be written in the old order
    (the key somewhere before the other arguments): that key is moved to the end, with a
    `DeprecationWarning`; a key-last call is returned unchanged."""
    values = (*args, key)
    if _is_key(key) or not any(_is_key(v) for v in args):
        return args, key
    where = next(i for i, v in enumerate(args) if _is_key(v))
    warnings.warn(
        f"{name}(...) with the PRNG key before other arguments is deprecated: the key is "
        "now the last argument, as in Sampler.step(logdensity, state, key).",
        DeprecationWarning,
        stacklevel=3,
    )
    rest = values[:where] + values[where + 1 :]
    return rest, values[where]
