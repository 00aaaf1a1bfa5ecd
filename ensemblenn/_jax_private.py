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


def as_weakly_typed(x: Any) -> Any:
    """`x` marked weakly typed (as a Python scalar would be); no public spelling exists.

    Checkpoints use it to restore values exactly as a run held them, since weak types
    change dtype promotion.
    """
    from jax._src.lax.lax import _convert_element_type

    return _convert_element_type(x, weak_type=True)


def backends_started() -> bool:
    """Whether JAX has already created its backends (after which
    `jax.distributed.initialize` is too late)."""
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", {}))


def pin_cpu_collectives_to(host: str) -> None:
    """Make the CPU client's gloo collectives listen on `host` rather than on the address
    the machine's hostname resolves to. Call after `jax.distributed.initialize` and before
    the first computation."""
    from jax._src import distributed as jax_distributed
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    def make_cpu_client() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=jax_distributed.global_state.client, hostname=host
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)
