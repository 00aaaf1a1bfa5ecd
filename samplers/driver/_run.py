"""`samplers.run`: the one driver. validate -> prepare (init, adaptation) -> chunk loop ->
finalise; each phase is a function of its own module in this package."""

import sys
import warnings
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .. import checkpoint
from .._compilation_cache import use_default_cache
from .._errors import PrecisionWarning
from ..adaptation import Adaptation
from ..kernels import Logdensity, Sampler
from ..targets import Target
from ._finalise import finalise
from ._flat import flatten_target, float64_leaves, float64_message
from ._initial import initial_positions, start_unset
from ._loop import Sampled, chunk_loop, new_trace, save, wait
from ._options import RunOptions
from ._prepare import prepare
from ._progress import Progress
from ._result import Result
from ._setup import Setup, make_setup
from ._validate import (
    check_finite,
    check_inputs,
    check_key,
    check_logdensity,
    check_logdensity_given,
    check_sampler_dim,
)
from ._verdict import ConvergenceWarning


def run(
    sampler: Sampler | None = None,
    logdensity: Logdensity | None = None,
    positions: Float[Array, "chains dim"] | Any = None,
    *,
    key: PRNGKeyArray,
    num_steps: int,
    num_chains: int | None = None,
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
    checkpoint_dir: "checkpoint.PathLike | None" = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    block_size: int | Literal["auto"] | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
) -> Result:
    """Run an ensemble of chains, sharded over the mesh, and summarise it on device.

    The whole run is a few `ensemble_map` calls: initialisation, the adaptation (if any),
    then the steps in chunks (one compiled `lax.while_loop` program, reused for every chunk
    and phase) so the host can show progress and save checkpoints. Per-chain keys
    come from `enn.chain_keys` and the global step index, so the result is the same on
    any device count and any chunking. Streaming moments cover every sampling step; the
    draws themselves are kept within a memory budget (see `thin`).

    Args:
        sampler: the kernel (None if the adaptation builds its own, as LAPS can:
            `samplers.run(logdensity=target, adaptation=samplers.LAPS(), ...)`). A step size
            left None (`samplers.NUTS()`) is tuned by the adaptation, starting at 1.0; without
            an adaptation it is an error.
        logdensity: a callable `position -> log density` of one chain's position, or a
            target module; a target's `reference` moments are used for `bias_squared` when
            `reference` is None.
        positions: initial positions: an array `(num_chains, dim)`, or any pytree of float
            arrays with a leading chain axis (e.g. `{"mu": (num_chains,), "theta":
            (num_chains, 8)}`, a NumPyro target's sites), which `logdensity` then receives
            one chain at a time. None draws them from the target (`initial_positions` of a
            `samplers.targets.from_numpyro` target: NumPyro's uniform in (-2, 2) on the
            unconstrained scale; `initial_position` of a standard target) for `num_chains`
            chains. float64 positions (numpy's default) are sampled in float32 unless
            `jax_enable_x64` is on: a `samplers.PrecisionWarning` then names them and the
            fix.
        key: the run's PRNG key.
        num_steps: sampling steps after warmup/adaptation; moments cover these.
        num_chains: the number of chains when `positions` is None (else it must match
            their leading axis, or be left out).
        num_warmup: steps run and discarded before sampling (besides any adaptation).
        adaptation: an ensemble adaptation scheme (`samplers.LAPS`, `ChEES`, `MEADS`).
        mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
        axis: the mesh axis over chains.
        thin: keep every `thin`-th sampling draw in `result.trace` (with its sample
            statistics in `result.sample_stats`, for `result.to_arviz()`). None (the
            default) keeps every draw if the trace fits a memory budget of 256 MiB for the
            whole run (`samplers.driver._setup.TRACE_MEMORY_BUDGET`: chains x kept draws x
            (position, observable, log density and 7 statistics) x itemsize), else every
            k-th draw for the smallest k that fits (the summary says which: "trace: every
            4th draw kept (memory budget 256 MiB)"; on an accelerator the buffer's rows
            are padded, up to twice that while sampling). 0 keeps no trace (thousands of
            chains, or many steps, where the streaming moments and diagnostics suffice).
        reference: `samplers.targets.Moments` to measure `bias_squared` against.
        superchain_size: group consecutive chains into superchains for nested R-hat,
            which the verdict then reads. None (the default) picks superchains by itself
            for many short chains (at least 64 chains and fewer than 1000 sampling steps:
            groups of 8 down to 4 chains, at least 16 groups; see
            `samplers.driver._verdict`), else split R-hat; 0 never uses superchains.
        track_bias: record the ensemble's b² after every sampling step
            (`result.bias_history`) and, for adaptations that support it (the built-in
            ones), after every adaptation step (`result.adaptation_bias`), with the
            gradients per chain spent so far (`result.bias_trajectory()`); needs a
            reference. The recording only reads the chains: the sampled values are the
            same with or without it.
        chunk_size: steps per compiled chunk (default: the run in 20 chunks, but at least
            100 steps each: one chunk for runs of up to 100 steps).
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
        block_size: `None` (the default) runs all of a device's chains in one batch:
            fastest on every backend, and the same result to rounding on any device count
            (XLA rounds per-chain arithmetic differently for another number of chains per
            device, and trajectories drift apart from the last bit: float32 positions
            differ by ~1e-5 after a short LAPS run). The bitwise mode: an int runs each
            chain's transition (and the adaptations' kernel steps) `block_size` chains at
            a time, through `enn.batch_invariant`, so the result is the same, bit for bit,
            on any number of devices (for the same `block_size`); `"auto"` is
            `max(1, num_chains // 8)`, which depends on the chain count only and needs no
            padding up to 8 devices. The blocks run one after another: 1.5-3x the time of
            one batch at 64-512 chains on a CPU, 2-6x on a GPU, where each block is a
            sliver of the device, but 0.5x for NUTS on a TPU v5e (its trajectory loop
            waits for the slowest chain of a batch, and a block waits less); measured:
            docs/benchmarks.md, `python -m benchmarks accelerator`. Only this mode pays
            for `enn.rounded` and `enn.ordered_sum`'s guards against XLA's
            reassociation. On an accelerator each chunk's length is also compiled into
            its program (a loop whose trip count XLA cannot see makes a GPU wait for the
            host every step), so a run whose last chunk is shorter compiles twice.

        on_chunk: `on_chunk(step, total)`, called on the host once the chains are
            initialised and adapted (or restored from a checkpoint), then after each chunk
            has run (and after its checkpoint, if one was due), with the steps done so far
            (warmup included) and the run's total; not called under an outer `jax.jit`. For
            logging, a time limit or a test: an exception raised in it ends the run and
            propagates, a `KeyboardInterrupt` as Ctrl-C does (the checkpoint keeps the
            last save, `err.step` says how far the run got). Each chunk is waited for
            before the call.

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
    use_default_cache()  # JAX's persistent cache, unless the user chose (_compilation_cache)
    check_key(key)
    check_logdensity_given(logdensity)
    check_inputs(sampler, adaptation, logdensity, positions, num_steps, num_warmup, thin)
    sampler = start_unset(sampler, adaptation)
    positions = initial_positions(logdensity, positions, num_chains, key)
    wide = float64_leaves(positions)  # before JAX converts them to float32
    positions = jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x,
                             positions)  # fmt: skip
    if reference is None:
        reference = getattr(logdensity, "reference", None)
    # Ravel once: from here on the chains are flat vectors (see _flat.py).
    user = logdensity
    logdensity, positions, position, observed = flatten_target(user, positions)
    if wide:
        root = jax.tree_util.treedef_is_leaf(position.treedef)  # one array, not a pytree
        warnings.warn(PrecisionWarning(float64_message(wide, plain=root)), stacklevel=2)
    observed = observed if _has_observable(user) else None
    check_finite(positions)
    one_position = check_logdensity(user, position.one_chain())  # False: a minibatch's
    num_chains = int(np.shape(positions)[0])
    options = RunOptions.checked(
        num_chains, num_steps=num_steps, num_warmup=num_warmup, thin=thin,
        reference=reference, superchain_size=superchain_size, track_bias=track_bias,
        chunk_size=chunk_size, mesh=mesh, axis=axis, block_size=block_size,
        progress=progress, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        resume=resume, on_chunk=on_chunk,
    )  # fmt: skip
    check_sampler_dim(sampler, positions)
    setup = make_setup(positions, key, options, position=position, observed=observed)
    # The checkpoint sees the flat positions; a wrapped log density carries the structure
    # (leaf names and shapes) into the fingerprint.
    store = checkpoint.open_run(
        options.checkpoint_dir, options.checkpoint_every, options.resume,
        traced=setup.traced, key=key, mesh=options.mesh, axis=options.axis, sampler=sampler,
        adaptation=adaptation, logdensity=logdensity, positions=positions,
        num_steps=options.num_steps, num_warmup=options.num_warmup, thin=options.thin,
        track_bias=setup.config.track_bias, block_size=options.block_size,
    )  # fmt: skip

    show = options.progress if options.progress is not None else sys.stderr.isatty()
    bar = Progress(setup.total, enabled=show and not setup.traced and jax.process_index() == 0)

    def start(bar: Progress | None = None) -> tuple:
        return prepare(setup, sampler, adaptation, logdensity, positions, bar)

    try:
        at, done = _sample(setup, logdensity, start, store, bar, options.on_chunk,
                           adapting=adaptation is not None)  # fmt: skip
        # Dispatched while the last chunk runs. `adapted`: whether an adaptation ran (the
        # verdict's fixes then do not suggest one).
        result = finalise(
            setup, at, logdensity, adapted=adaptation is not None, one_position=one_position
        )
        wait(at, done, setup.total)
    except BaseException:
        if store is not None:  # interrupted or failed: this run will not go on
            store.close()
        raise
    finally:
        bar.close()
    if not setup.traced:  # the rule: samplers.driver._verdict
        verdict = result.verdict
        if not verdict.converged:
            warnings.warn(ConvergenceWarning(verdict.line), stacklevel=2)
    return result


def _sample(
    setup: Setup,
    logdensity: Any,
    start: Callable[..., tuple],
    store: "checkpoint.Store | None",
    bar: Progress,
    on_chunk: Callable[[int, int], None] | None,
    *,
    adapting: bool,
) -> tuple[Sampled, int]:
    """Initialise and adapt (or restore a checkpoint), then run the chunks (see
    `chunk_loop`)."""
    saved = store.restore(start, setup.run_keys) if store is not None else None
    if saved is None:
        at, first_step = Sampled(*start(bar), trace=None, bias_history=[]), 0
        at = at._replace(trace=new_trace(setup, at.carry))
        if store is not None and adapting:
            save(store, setup, at, 0)  # adaptation can be long: keep its outcome
    else:
        rows = saved.trace_list()
        trace = new_trace(setup, saved.carry, rows[0] if rows else None)
        at = Sampled(saved.sampler, saved.carry, saved.adaptation_info, trace,
                     saved.bias_list())  # fmt: skip
        first_step = saved.step
        bar.start_at(first_step)
    return chunk_loop(setup, logdensity, at, first_step, store, bar, on_chunk)


def _has_observable(logdensity: Any) -> bool:
    """Whether the log density has an observable other than the position itself.

    A `Target` that keeps the base class's identity observable gets no second set of
    moments: they would duplicate the position's and cost as much to stream again.
    """
    observe = getattr(type(logdensity), "observable", None)
    if observe is None:
        return hasattr(logdensity, "observable")  # set on the instance
    return observe is not Target.observable
