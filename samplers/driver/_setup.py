"""Everything a run resolves once, before the first compilation: its shape, keys and options."""

import functools
import math
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, PRNGKeyArray

import ensemblenn as enn

from ._chunk import TRACE_STATS, Carry, Config
from ._flat import Structure
from ._moments import StreamingSums
from ._options import RunOptions
from ._verdict import automatic_superchain_size


class Setup(NamedTuple):
    """The fixed facts of one `samplers.run` call, handed to each of its phases."""

    num_chains: int
    num_warmup: int
    num_steps: int
    thin: int  # resolved: keep every `thin`-th sampling draw; 0 keeps no trace
    reference: Any
    superchain_size: int | None
    config: Config
    init_keys: Array
    adapt_keys: Array
    run_keys: Array
    traced: bool  # called under a trace (jit, eval_shape): no eager checks, no progress
    # Each chunk's length compiled in (accelerators: a loop with a known trip count runs
    # without the host), else one program for every length (CPU: one compilation).
    static_chunks: bool
    position: Structure  # one chain's position pytree <-> flat vectors
    observed: Structure | None  # the observable's, or None when the target has none
    options: RunOptions  # as given to `samplers.run`, checked
    superchain_auto: bool = False  # superchain_size was chosen by the verdict's rule
    thin_auto: bool = False  # thin was chosen to fit TRACE_MEMORY_BUDGET (thin=None)

    @property
    def mapping(self) -> dict[str, Any]:
        """The keyword arguments of every `enn.ensemble_map` of the run."""
        return self.options.mapping

    @property
    def num_kept(self) -> int:
        """Draws the run keeps in its trace (0 with `thin=0`)."""
        return self.num_steps // self.thin if self.thin else 0

    @property
    def total(self) -> int:
        return self.num_warmup + self.num_steps

    @property
    def carry_plan(self) -> "CarryPlan":
        """What one chain's carry at step 0 looks like, as static facts."""
        obs = self.observed
        slots = -(-self.num_steps // self.num_chains) if self.config.track_bias else None
        return CarryPlan(
            None if obs is None else obs.dim, None if obs is None else obs.dtype, slots
        )


class CarryPlan(eqx.Module):
    """Builds ONE chain's carry before the first step: zero moments and counters.

    Used inside the programs that initialise or adapt the chains, so the carry is born on
    the mesh instead of being built eagerly and copied there (a copy per leaf per call).
    """

    observed_dim: int | None = eqx.field(static=True)
    observed_dtype: Any = eqx.field(static=True)
    bias_slots: int | None = eqx.field(static=True)  # with track_bias: see `Carry`

    def initial_carry(self, state: Any) -> Carry:
        dim, dtype = int(state.position.shape[-1]), state.position.dtype
        moments = StreamingSums.zeros(dim, dtype, self.observed_dim, self.observed_dtype)
        bias_grads = None if self.bias_slots is None else jnp.zeros(self.bias_slots, jnp.float32)
        return Carry(
            state=state,
            moments=moments,
            acceptance=jnp.zeros((), jnp.float32),
            divergent=jnp.zeros((), jnp.int32),
            grads=jnp.zeros((), jnp.int32),
            bias_grads=bias_grads,
        )


TRACE_MEMORY_BUDGET = 256 * 2**20
"""Bytes the kept draws of one `samplers.run` call may take by default (`thin=None`), all
chains and devices together: the trace rows (positions and per-draw sample statistics)
on the devices, plus the observables and log densities computed from them at the end.
Every draw is kept if they fit, else every k-th draw for the smallest k that fits. On an
accelerator the rows are padded to the TPU's tiles while sampling (`_chunk._flat_width`),
up to twice the position's and statistics' bytes; the same k is chosen on every platform."""


def trace_row_bytes(position: Structure, observed: Structure | None) -> int:
    """Bytes one chain's kept draw takes: its trace row (the position and `TRACE_STATS`, its
    log density among them) and the observable computed from it at the end."""
    itemsize = np.dtype(position.dtype).itemsize
    row = (position.dim + len(TRACE_STATS)) * itemsize
    if observed is not None:
        row += observed.dim * np.dtype(observed.dtype).itemsize
    return row


def automatic_thin(num_chains: int, num_steps: int, row_bytes: int) -> int:
    """The smallest `thin` whose kept draws fit `TRACE_MEMORY_BUDGET` (0: not even one
    draw per chain fits, and no trace is kept).

    Example:
        >>> automatic_thin(64, 1000, 100)   # 6.4 MB: every draw
        1
        >>> automatic_thin(4096, 10_000, 100)   # 4 GB: every 16th draw, 256 MB
        16
    """
    per_draw = num_chains * row_bytes
    fits = TRACE_MEMORY_BUDGET // per_draw  # draws per chain within the budget
    if fits < 1:
        return 0
    return max(1, math.ceil(num_steps / fits))


@functools.lru_cache(maxsize=32)
def _run_keys(num_chains: int, sharding: NamedSharding) -> Any:
    """The compiled program: one key -> per-chain keys for initialisation, adaptation and
    the steps (`enn.chain_keys` of each of `jax.random.split(key, 3)`)."""

    def make(key: PRNGKeyArray) -> tuple:
        return tuple(enn.chain_keys(k, num_chains) for k in jax.random.split(key, 3))

    return jax.jit(make, out_shardings=(sharding,) * 3)


def make_setup(
    positions: Any,
    key: PRNGKeyArray,
    options: RunOptions,
    *,
    position: Structure,
    observed: Structure | None,
) -> Setup:
    """The run's `Setup`; `positions` are the flat `(num_chains, dim)` ones."""
    num_chains = int(jax.tree.leaves(positions)[0].shape[0])
    num_steps, num_warmup, thin = options.num_steps, options.num_warmup, options.thin
    mesh, axis, superchain_size = options.mesh, options.axis, options.superchain_size
    # The one place superchains are resolved: None lets the verdict's rule pick them for
    # many short chains (samplers.driver._verdict), 0 asks for none (split R-hat).
    superchain_auto = superchain_size is None
    if superchain_auto:
        superchain_size = automatic_superchain_size(num_chains, num_steps)
    superchain_size = superchain_size or None
    # thin=None: every draw if the trace fits the budget, else thinned to fit; 0: none.
    thin_auto = thin is None
    if thin_auto:
        thin = automatic_thin(num_chains, num_steps, trace_row_bytes(position, observed))
    thin_by = thin or 1
    total = num_warmup + num_steps
    # At least 100 steps per chunk (one chunk up to 100 steps), 20 chunks from 2,000 steps:
    # each chunk costs a dispatch and a host round trip, ~1.5x a short run's time at 20.
    capacity = options.chunk_size or max(1, math.ceil(total / 20), min(total, 100))
    capacity = max(thin_by, capacity // thin_by * thin_by)
    resolved = enn.resolve_mesh(mesh, axis)
    platform = enn.mesh_platform(resolved, axis)
    skip_unkept = thin_by > 1 and platform != "gpu"
    config = Config(
        capacity=capacity,
        thin=thin_by,
        half_point=num_steps // 2,
        first_sample=num_warmup,
        track_bias=options.track_bias and options.reference is not None,
        num_chains=num_chains,
        skip_unkept=skip_unkept,
        # Every kept draw, and a scratch row where unkept steps write after the last one.
        rows=num_steps // thin_by + (thin_by > 1 and not skip_unkept),
        flat_trace=platform != "cpu",
    )
    traced = any(isinstance(x, jax.core.Tracer) for x in (*jax.tree.leaves(positions), key))
    even = num_chains % dict(zip(resolved.axis_names, resolved.axis_sizes))[axis] == 0
    if not traced and jax.process_count() == 1 and even:
        # One program makes the three key sets, laid out on the mesh: not a dozen eager
        # dispatches, nor a copy to the devices by every chunk's call. (Chains that do not
        # split evenly over the devices cannot be laid out: ensemble_map then raises its
        # ChainCountError, which says how to fix it.)
        keys = _run_keys(num_chains, NamedSharding(resolved, P(axis)))(key)
    else:
        # Process-aware chain keys: global arrays laid out like the chains when several
        # processes share the mesh.
        k_init, k_adapt, k_run = jax.random.split(key, 3)
        keys = [
            enn.chain_keys(k, num_chains, mesh=mesh, axis=axis) for k in (k_init, k_adapt, k_run)
        ]
    return Setup(
        num_chains=num_chains,
        num_warmup=num_warmup,
        num_steps=num_steps,
        thin=thin,
        reference=options.reference,
        superchain_size=superchain_size,
        config=config,
        init_keys=keys[0],
        adapt_keys=keys[1],
        run_keys=keys[2],
        options=options,
        traced=traced,
        static_chunks=platform != "cpu",
        position=position,
        observed=observed,
        superchain_auto=superchain_auto and superchain_size is not None,
        thin_auto=thin_auto,
    )
