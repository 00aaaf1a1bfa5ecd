"""Every use of JAX internals in ensemblenn, in one place.

`tests/test_jax_private.py` exercises each of these so that a JAX release that moves them
fails loudly there, not somewhere deep in `ensemble_map`.
"""

from typing import Any

from jax._src.interpreters import batching as _batching


def is_batched_over(x: Any, axis_name: str) -> bool:
    """Whether `x` is a value mapped by the `jax.vmap` whose `axis_name` is given.

    Used to infer output roles: a value that depends on a per-chain input is batched by
    the local-chains vmap; one that does not is the same for every chain.
    """
    if not isinstance(x, _batching.BatchTracer):
        return False
    trace = x._trace
    data = getattr(trace, "axis_data", None)
    return getattr(data, "name", None) == axis_name
