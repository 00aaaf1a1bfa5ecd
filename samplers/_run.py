"""`samplers.run`: the one driver, a scan over steps inside `ensemble_map`."""

import functools
import math
import sys
import time
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from . import checkpoint as _checkpoint
from . import distributed as _distributed
from ._adaptation import Adaptation
from ._moments import ChainMoments
from ._progress import Progress
from ._result import Diagnostics, Result
from ._sampler import Logdensity, Sampler, init_chain, step_chain


class _Config(eqx.Module):
    """The static shape of a chunk of steps (part of the compilation key).

    Every chunk of a run shares it, whatever its length or phase, so a run compiles once.
    """

    capacity: int = eqx.field(static=True)
    thin: int = eqx.field(static=True)
    half_point: int = eqx.field(static=True)
    first_sample: int = eqx.field(static=True)
    track_bias: bool = eqx.field(static=True)
    keep_trace: bool = eqx.field(static=True)


class _Carry(eqx.Module):
    state: Any
    moments: ChainMoments
    acceptance: Float[Array, ""]
    divergent: Any
    grads: Any


def _init_chain(
    sampler: Sampler | None,
    adaptation: Adaptation | None,
    logdensity: Logdensity,
    position: Array,
    key: PRNGKeyArray,
) -> Any:
    if adaptation is not None:
        return adaptation.initial_state(sampler, logdensity, position, key)
    return init_chain(sampler, logdensity, position, key)


def _adapt_chain(
    adaptation: Adaptation,
    sampler: Sampler | None,
    logdensity: Logdensity,
    state: Any,
    key: PRNGKeyArray,
) -> tuple[Sampler, Any, Any]:
    return adaptation.run(sampler, logdensity, state, key)


def _chunk(
    config: _Config,
    sampler: Sampler,
    logdensity: Logdensity,
    carry: _Carry,
    key: PRNGKeyArray,
    start: Array,
    length: Array,
    reference: Any,
) -> tuple:
    """`length` (<= capacity) steps of one chain, from global step `start`.

    Steps before `config.first_sample` are warmup: they move the chain but add nothing to
    the moments, the trace or the bias history.
    """
    from . import diagnostics as diag

    observe = getattr(logdensity, "observable", lambda x: x)
    dim = carry.state.position.shape[-1]
    draws = jnp.zeros((config.capacity // config.thin, dim), carry.state.position.dtype)
    bias = jnp.zeros((config.capacity, 2), jnp.float32)

    def body(loop: tuple) -> tuple:
        i, kept, c, draws, bias = loop
        t = start + i
        state, info = step_chain(sampler, logdensity, c.state, jax.random.fold_in(key, t))
        since = t - config.first_sample
        sampling = since >= 0
        observed = observe(state.position)
        updated = c.moments.update(
            state.position, (since >= config.half_point).astype(jnp.int32), observed
        )
        moments = jax.tree.map(lambda new, old: jnp.where(sampling, new, old), updated, c.moments)
        c = _Carry(
            state,
            moments,
            c.acceptance + info.acceptance_rate,
            c.divergent + info.is_divergent.astype(jnp.int32),
            c.grads + info.num_grads,
        )
        if config.keep_trace:
            keep = sampling & ((since + 1) % config.thin == 0)
            draws = jnp.where(keep, draws.at[kept].set(state.position), draws)
            kept = kept + keep.astype(jnp.int32)
        if config.track_bias and reference is not None:
            estimate = enn.chain_mean(observed**2)
            b2 = jnp.stack(
                diag.bias_squared(estimate, reference.second_moment, reference.second_moment_var)
            )
            bias = bias.at[i].set(b2.astype(jnp.float32))
        return i + 1, kept, c, draws, bias

    acc_before = carry.acceptance
    loop = (jnp.int32(0), jnp.int32(0), carry, draws, bias)
    _, _, carry, draws, bias = jax.lax.while_loop(lambda lp: lp[0] < length, body, loop)
    chunk_acceptance = enn.chain_mean((carry.acceptance - acc_before) / length)
    return (
        carry,
        draws if config.keep_trace else None,
        (chunk_acceptance, bias if config.track_bias else None),
    )


def _diagnose(moments: ChainMoments, reference: Any, superchain_size: int | None) -> Diagnostics:
    """Ensemble diagnostics from every chain's moments (identical on every device)."""
    from . import diagnostics as diag

    half_mean, half_var = moments.half_mean_var()
    mean, var = moments.chain_mean_var()
    every = enn.chain_all_gather((half_mean, half_var, mean, var, moments.count))
    half_mean, half_var, mean, var, count = every
    dim = mean.shape[-1]
    n_half = count.min()
    rhat = diag.split_rhat_from_moments(
        half_mean.reshape(-1, dim), half_var.reshape(-1, dim), n_half
    )
    n = count.sum(-1).min()
    ess = diag.ess_from_moments(mean, var, n)
    nested = None
    if superchain_size is not None:
        nested = diag.nested_rhat_from_moments(mean, var, n, superchain_size)
    ens_mean = enn.chain_mean(moments.chain_mean_var()[0])
    ens_second = enn.chain_mean(moments.second_moment)
    b2_max = b2_mean = None
    if reference is not None:
        observed_second = enn.chain_mean(moments.observable_second_moment)
        b2_max, b2_mean = diag.bias_squared(
            observed_second, reference.second_moment, reference.second_moment_var
        )
    return Diagnostics(
        mean=ens_mean,
        sd=jnp.sqrt(jnp.maximum(ens_second - ens_mean**2, 0.0)),
        second_moment=ens_second,
        rhat=rhat,
        nested_rhat=nested,
        ess=ess,
        bias_squared_max=b2_max,
        bias_squared_mean=b2_mean,
    )


def _on_mesh_of(x: Any, fn: Any) -> Any:
    """`fn(x)` with `x`'s mesh as the context mesh: eager operations on arrays sharded over
    an Explicit mesh need it."""
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.core.Tracer) or not isinstance(sharding, jax.sharding.NamedSharding):
        return fn(x)
    with jax.set_mesh(sharding.mesh):
        return fn(x)


def _check_logdensity(logdensity: Any, positions: Any) -> None:
    """The log-density must map one position to a scalar."""
    one = jax.ShapeDtypeStruct(np.shape(positions)[1:], positions.dtype)
    try:
        out = jax.eval_shape(logdensity, one)
    except TypeError:
        return  # e.g. a minibatch log-density (position, indices): its kernel checks it
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise enn.EnsembleError(
            f"logdensity must return a scalar for ONE position of shape "
            f"{np.shape(positions)[1:]}, but it returns {shape}.\n  fix: sum the terms, e.g. "
            "return jnp.sum(log_terms); samplers.run maps it over the chains itself."
        )


def _check_key(key: Any) -> None:
    typed = isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if (typed and key.shape != ()) or (
        not typed and (np.shape(key) != (2,) or getattr(key, "dtype", None) != jnp.uint32)
    ):
        raise enn.EnsembleError(
            f"key must be one PRNG key (jax.random.key(seed), or a uint32[2] "
            f"jax.random.PRNGKey), got {getattr(key, 'dtype', type(key).__name__)}"
            f"{list(np.shape(key))}.\n  fix: key=jax.random.key(0); run makes per-chain keys."
        )


def _check_inputs(
    sampler: Any,
    adaptation: Any,
    logdensity: Any,
    positions: Any,
    num_steps: Any,
    num_warmup: Any,
    thin: Any,
) -> None:
    if adaptation is None and not isinstance(sampler, Sampler):
        raise enn.EnsembleError(
            f"sampler must be a samplers.Sampler (e.g. samplers.HMC(...)), got "
            f"{type(sampler).__name__}."
        )
    if adaptation is not None and not isinstance(adaptation, Adaptation):
        raise enn.EnsembleError(
            f"adaptation must be a samplers.Adaptation (e.g. samplers.LAPS(...)), got "
            f"{type(adaptation).__name__}."
        )
    if not callable(logdensity):
        raise enn.EnsembleError(
            f"logdensity must be callable (a function or a target module), got "
            f"{type(logdensity).__name__}."
        )
    for name, value, low in (("num_steps", num_steps, 1), ("num_warmup", num_warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise enn.EnsembleError(f"{name} must be an int >= {low}, got {value!r}.")
    if thin is not None and (not isinstance(thin, int) or thin < 1 or thin > num_steps):
        raise enn.EnsembleError(f"thin must be None or an int in [1, num_steps], got {thin!r}.")
    shape = np.shape(positions)
    if len(shape) != 2:
        raise enn.EnsembleError(
            f"positions must have shape (num_chains, dim), got shape {shape}.\n  fix: stack one "
            "initial position per chain, e.g. jnp.zeros((num_chains, dim))."
        )
    dtype = positions.dtype if hasattr(positions, "dtype") else np.asarray(positions).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise enn.EnsembleError(
            f"positions must be floating point, got dtype {dtype}.\n  fix: "
            "positions.astype(jnp.float32)."
        )
    if not isinstance(positions, jax.core.Tracer):
        finite = np.isfinite(np.asarray(positions))
        if not finite.all():
            bad = np.argwhere(~finite.all(axis=1)).ravel()[:5].tolist()
            raise enn.EnsembleError(
                f"positions has non-finite (NaN/inf) entries in chains {bad}: every chain must "
                "start at a finite point."
            )


def run(
    sampler: Sampler | None,
    logdensity: Logdensity,
    positions: Float[Array, "chains dim"],
    *,
    key: PRNGKeyArray,
    num_steps: int,
    num_warmup: int = 0,
    adaptation: Adaptation | None = None,
    mesh: Any = None,
    axis: str = "chains",
    thin: int | None = None,
    reference: Any = None,
    superchain_size: int | None = None,
    track_bias: bool = False,
    chunk_size: int | None = None,
    progress: bool | None = None,
    checkpoint_dir: "_checkpoint.PathLike | None" = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    block_size: int | Literal["auto"] | None = "auto",
) -> Result:
    """Run an ensemble of chains, sharded over the mesh, and summarise it on device.

    The whole run is a few `ensemble_map` calls: initialisation, the adaptation (if any),
    then the steps in chunks of a `lax.scan` so the host can show progress. Per-chain keys
    come from `enn.chain_keys` and the global step index, so the result is the same on
    any device count and any chunking. Only streaming moments are kept unless `thin` asks
    for a trace.

    Args:
        sampler: the kernel (`None` if the adaptation builds its own, as LAPS can).
        logdensity: a callable `position -> log density`, or a target module; a target's
            `reference` moments are used for `bias_squared` when `reference` is None.
        positions: initial positions, `(num_chains, dim)`.
        key: the run's PRNG key.
        num_steps: sampling steps after warmup/adaptation; moments cover these.
        num_warmup: steps run and discarded before sampling (besides any adaptation).
        adaptation: an ensemble adaptation scheme (`samplers.LAPS`, `ChEES`, `MEADS`).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis over chains.
        thin: keep every `thin`-th sampling draw in `result.trace`; None keeps no trace.
        reference: `samplers.targets.Moments` to measure `bias_squared` against.
        superchain_size: group consecutive chains into superchains for nested R-hat.
        track_bias: record the ensemble's b² after every sampling step.
        chunk_size: steps per compiled chunk (default: about 20 chunks).
        progress: show one progress bar for the ensemble (default: when stderr is a tty;
            with several processes, on process 0 only).
        checkpoint_dir: a folder to save the run in, so that it can be resumed (see
            `samplers.checkpoint`); None saves nothing.
        checkpoint_every: save when the step count (warmup included) passes a multiple
            of this, at the end of that chunk; None saves after every chunk. A run also
            saves at its end, and right after adaptation.
        resume: continue from the checkpoint in `checkpoint_dir` if there is one (else
            start afresh). Initialisation and adaptation are then skipped, and the result
            is bitwise the uninterrupted run's on the same device count. A checkpoint of a
            run with another configuration raises `samplers.CheckpointMismatchError`;
            with resume=False an existing checkpoint raises `samplers.CheckpointError`.
        block_size: run each chain's transition (and the adaptations' kernel steps)
            `block_size` chains at a time, through `enn.batch_invariant`, so that the
            result is the same, bit for bit, on any number of devices holding the chains
            (for the same `block_size`). `"auto"` (the default) is
            `max(1, num_chains // 8)`: it depends on the chain count only, and up to 8
            devices it needs no padding. `None` runs all of a device's chains in one
            batch: XLA may then round the per-chain arithmetic differently for another
            number of chains per device, and trajectories drift apart from the last bit
            (float32 positions differ by ~1e-5 after a short LAPS run). The blocks cost
            time: 1.0-1.5x the sampling time of `None` on CPU (`python -m benchmarks
            blocks`); with thousands of chains per accelerator, `None` is the fast choice.

    Returns:
        A `samplers.Result`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
        >>> result = samplers.run(samplers.MALA(step_size=0.5), target, jnp.zeros((8, 3)),
        ...                       key=jax.random.key(1), num_steps=100, progress=False)
        >>> result.state.position.shape, result.diagnostics.rhat.shape
        ((8, 3), (3,))
    """
    _check_inputs(sampler, adaptation, logdensity, positions, num_steps, num_warmup, thin)
    _check_key(key)
    positions = jnp.asarray(positions) if isinstance(positions, np.ndarray) else positions
    _check_logdensity(logdensity, positions)
    if reference is None:
        reference = getattr(logdensity, "reference", None)
    num_chains = int(np.shape(positions)[0])
    k_init, k_adapt, k_run = jax.random.split(key, 3)
    common = dict(mesh=mesh, axis=axis, block_size=block_size)
    traced = isinstance(positions, jax.core.Tracer) or isinstance(key, jax.core.Tracer)
    show = (
        (progress if progress is not None else sys.stderr.isatty())
        and not traced
        and jax.process_index() == 0
    )  # several processes: one bar, on process 0
    # enn.chain_keys, but laid out as global arrays when several processes share the mesh.
    chain_keys = functools.partial(_distributed.chain_keys, mesh=mesh, axis=axis)
    store = _checkpoint.open_run(
        checkpoint_dir,
        checkpoint_every,
        resume,
        traced=traced,
        key=key,
        mesh=mesh,
        axis=axis,
        sampler=sampler,
        adaptation=adaptation,
        logdensity=logdensity,
        positions=positions,
        num_steps=num_steps,
        num_warmup=num_warmup,
        thin=thin,
        track_bias=track_bias and reference is not None,
        block_size=block_size,
    )

    def prepare() -> tuple[Any, _Carry, Any]:
        """Initialisation and adaptation; a resumed run loads their outcome instead."""
        init = enn.ensemble_map(
            _init_chain,
            in_roles=(None, None, None, PER_CHAIN, PER_CHAIN),
            out_roles=PER_CHAIN,
            **common,
        )
        state = init(sampler, adaptation, logdensity, positions, chain_keys(k_init, num_chains))
        if (
            not traced
            and jax.process_count() == 1
            and not isinstance(state.logdensity, jax.core.Tracer)  # resume: shapes only
            and not bool(jnp.isfinite(state.logdensity).any())
        ):
            raise enn.EnsembleError(
                "logdensity is not finite (NaN or -inf) at any initial position, so no chain "
                "can move.\n  fix: check the log-density and start the chains inside its "
                "support."
            )
        tuned, adaptation_info = sampler, None
        if adaptation is not None:
            adapt = enn.ensemble_map(
                _adapt_chain,
                in_roles=(None, None, None, PER_CHAIN, PER_CHAIN),
                out_roles=(None, PER_CHAIN, None),
                **common,
            )
            tuned, state, adaptation_info = adapt(
                adaptation, sampler, logdensity, state, chain_keys(k_adapt, num_chains)
            )

        dim = int(np.shape(state.position)[-1])
        dtype = state.position.dtype
        zeros = jnp.zeros(num_chains)
        carry = _Carry(
            state,
            jax.vmap(lambda _: ChainMoments.zeros(dim, dtype))(zeros),
            zeros.astype(jnp.float32),
            zeros.astype(jnp.int32),
            zeros.astype(jnp.int32),
        )
        return tuned, carry, adaptation_info

    keys = chain_keys(k_run, num_chains)
    saved = store.restore(prepare, keys) if store is not None else None
    if saved is None:
        first, trace, bias_history = 0, [], []
        sampler, carry, adaptation_info = prepare()
    else:
        first, trace, bias_history = saved.step, saved.trace_list(), saved.bias_list()
        sampler, carry, adaptation_info = saved.sampler, saved.carry, saved.adaptation_info
    chunk_fn = enn.ensemble_map(
        _chunk,
        in_roles=(None, None, None, PER_CHAIN, PER_CHAIN, BROADCAST, BROADCAST, None),
        out_roles=(PER_CHAIN, PER_CHAIN, BROADCAST),
        **common,
    )
    thin_by = thin or 1
    total = num_warmup + num_steps
    capacity = chunk_size or max(1, math.ceil(total / 20))
    capacity = max(thin_by, capacity // thin_by * thin_by)
    config = _Config(
        capacity,
        thin_by,
        num_steps // 2,
        num_warmup,
        track_bias and reference is not None,
        bool(thin),
    )
    bar = Progress(total, enabled=show)

    def save(step: int) -> None:
        store.save(
            _checkpoint.Snapshot.of_run(
                step,
                sampler,
                carry,
                adaptation_info,
                keys,
                trace if thin else None,
                bias_history if config.track_bias else None,
            ),
            total,
        )

    if store is not None and saved is None and adaptation is not None:
        save(0)  # adaptation can be long: keep its outcome
    for start in range(first, total, capacity):
        length = min(capacity, total - start)
        tick = time.perf_counter()
        carry, draws, (acc, bias) = chunk_fn(
            config, sampler, logdensity, carry, keys, jnp.int32(start), jnp.int32(length), reference
        )
        sampled = [t for t in range(start, start + length) if t >= num_warmup]
        if thin:
            kept = sum(1 for t in sampled if (t - num_warmup + 1) % thin_by == 0)
            if kept:
                trace.append(_on_mesh_of(draws, lambda d: d[:, :kept]))
        if bias is not None and sampled:
            bias_history.append(_on_mesh_of(bias, lambda b: b[sampled[0] - start : length]))
        bar.update(
            length,
            acc,
            time.perf_counter() - tick,
            "warmup" if start + length <= num_warmup else "sampling",
        )
        if store is not None and store.due(start + length, total):
            save(start + length)
    bar.close()

    diagnose = enn.ensemble_map(
        _diagnose, in_roles=(PER_CHAIN, BROADCAST, None), out_roles=BROADCAST, **common
    )
    diagnostics = diagnose(carry.moments, reference, superchain_size)
    total_steps = num_warmup + num_steps
    return Result(
        state=carry.state,
        sampler=sampler,
        moments=carry.moments,
        diagnostics=diagnostics,
        acceptance_rate=carry.acceptance / total_steps,
        num_divergent=carry.divergent,
        num_grads=carry.grads,
        trace=_on_mesh_of(trace[0], lambda _: jnp.concatenate(trace, axis=1)) if trace else None,
        bias_history=(
            _on_mesh_of(bias_history[0], lambda _: jnp.concatenate(bias_history))
            if bias_history
            else None
        ),
        adaptation_info=adaptation_info,
        num_steps=num_steps,
        num_warmup=num_warmup,
        superchain_size=superchain_size,
    )
