"""SMC: cross-device resampling per scheme, and samplers.SMC vs BlackJAX's tempered SMC.

Part `resampling`: `samplers.smc.resample` of `--particles` particles of `--floats` float32
each, inside one `enn.ensemble_map` body that resamples `--rounds` times in a
`lax.fori_loop` (the time per resampling excludes the call's fixed cost), per scheme
(`resample` takes the particles with `enn.chain_take(..., reach=N / D)`: the neighbours'
blocks, or every particle when an ancestor lies further away); then, in raw
`jax.shard_map`, the same systematic resampling two ways: every device all-gathers every
particle, or a neighbour exchange of a smaller fixed-size prefix and suffix of each
device's block (falling back to the all-gather when a device needs rows from further
away). The raw rows return the same bits as `resample` (checked). Timed in alternation,
min and median; `MB/dev` is what one device receives per resampling.

Part `smc`: `samplers.SMC` vs `blackjax.adaptive_tempered_smc` on a conjugate Gaussian
(prior N(0, I_d), one observation per coordinate with unit noise: log Z is known exactly),
for `--dims` (10 and 100). Both sides: the same initial particles (draws of the prior), a
random-walk Metropolis kernel, `--mutation-steps` steps per stage, target ESS 0.5,
systematic resampling, and a proposal scale of `2.38 / sqrt(d)` times the particles'
standard deviation per coordinate, recomputed at every stage (BlackJAX through
`inner_kernel_tuning`; ours is `metric="diagonal"`, which also moves the step size towards
an acceptance of 0.234 once per stage). Ours runs sharded over the process's devices (host
loop over stages, two programs per stage); BlackJAX is `jax.jit` of a `lax.while_loop`
over its stages on one device. One warm-up run each, then `--seeds` runs each,
alternating which goes first. `us/mut` is the wall time per particle-mutation (the run's
time over stages x particles x mutation steps; the stage counts differ slightly, as the
two bisections differ), min and median over the seeds; `logZ err` is the mean error over
the seeds and `sd` its spread; `se` (ours) is the mean of the run's own standard error.
"""

import argparse
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
import samplers
from samplers.smc import SCHEMES, ancestors, resample

from ._common import emit, error_text, have, mesh_for, print_machine, skipped
from .overhead import interleaved

BENCH = "smc"

COLUMNS = [
    ("part", "part", ""),
    ("impl", "impl", ""),
    ("devices", "dev", "d"),
    ("particles", "particles", "d"),
    ("dim", "floats", "d"),
    ("ms", "ms (min)", ".3f"),
    ("ms_median", "ms (median)", ".3f"),
    ("mb_received", "MB/dev", ".2f"),
    ("stages", "stages", ".1f"),
    ("us_per_mutation", "us/mut (min)", ".3f"),
    ("us_per_mutation_median", "us/mut (median)", ".3f"),
    ("log_z_error", "logZ err", ".3f"),
    ("log_z_sd", "sd", ".3f"),
    ("log_z_se", "se", ".3f"),
    ("load", "load", ".1f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="resampling,smc", help="comma-separated: resampling,smc")
    p.add_argument("--particles", type=int, default=None, help="default 4096")
    p.add_argument("--floats", type=int, default=None, help="floats per particle (100)")
    p.add_argument("--rounds", type=int, default=None, help="resamplings per call (50)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timings (7)")
    p.add_argument("--dims", default=None, help="SMC target dimensions (10,100)")
    p.add_argument("--smc-particles", type=int, default=None, help="SMC particles (1024)")
    p.add_argument("--mutation-steps", type=int, default=None, help="per stage (10)")
    p.add_argument("--seeds", type=int, default=None, help="SMC runs per side (5)")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")


# --- resampling --------------------------------------------------------------------------


def _looped_resample(scheme: str, rounds: int, mesh: Any) -> Any:
    def body(key: Any, log_weight: Any, particle: Any) -> Any:
        def one(i: Any, p: Any) -> Any:
            return resample(jax.random.fold_in(key, i), log_weight, p, scheme=scheme)[0]

        return lax.fori_loop(0, rounds, one, particle)

    return enn.ensemble_map(body, mesh=mesh, in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN))


def _raw(kind: str, rounds: int, mesh: Any, n: int, caps: tuple[int, ...]) -> Any:
    """Systematic resampling at the device level (no vmap), by all-gather or neighbours."""
    devices = mesh.shape["chains"]
    local = n // devices

    def step(key: Any, lw: Any, x: Any) -> tuple[Any, Any]:
        a = ancestors(key, lax.all_gather(lw, "chains", tiled=True))
        d = lax.axis_index("chains")
        mine = lax.dynamic_slice_in_dim(a, d * local, local)

        def gather_all(x: Any) -> Any:
            return lax.all_gather(x, "chains", tiled=True)[mine]

        if kind == "all_gather":
            return gather_all(x), jnp.int32(len(caps))
        # The rows each device needs from its neighbours, known on every device.
        first, last, dev = a[::local], a[local - 1 :: local], jnp.arange(devices)
        near = ((first // local >= dev - 1) & (last // local <= dev + 1)).all()
        need = jnp.maximum(
            jnp.where(last // local > dev, last - (dev + 1) * local + 1, 0).max(),
            jnp.where(first // local < dev, dev * local - first, 0).max(),
        )
        src = mine // local
        own = x[jnp.clip(mine - d * local, 0, local - 1)]

        def exchange(c: int) -> Any:
            def go(x: Any) -> Any:
                up = [(j, j - 1) for j in range(1, devices)]
                down = [(j, j + 1) for j in range(devices - 1)]
                prefix = lax.ppermute(x[:c], "chains", up)  # from device d + 1
                suffix = lax.ppermute(x[local - c :], "chains", down)  # from d - 1
                p = prefix[jnp.clip(mine - (d + 1) * local, 0, c - 1)]
                s = suffix[jnp.clip(mine - (d * local - c), 0, c - 1)]
                out = jnp.where((src == d - 1)[:, None], s, own)
                return jnp.where((src == d + 1)[:, None], p, out)

            return go

        branch = jnp.where(near, jnp.searchsorted(jnp.asarray(caps), need), len(caps))
        return lax.switch(branch, [exchange(c) for c in caps] + [gather_all], x), branch

    def body(key: Any, lw: Any, x: Any) -> tuple[Any, Any]:
        def one(i: Any, carry: tuple) -> tuple:
            x, widest = carry
            x, branch = step(jax.random.fold_in(key, i), lw, x)
            return x, jnp.maximum(widest, branch)

        x, widest = lax.fori_loop(0, rounds, one, (x, jnp.int32(0)))
        return x, widest[None]

    spec = P("chains")
    return jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=(P(), spec, spec), out_specs=(spec, spec), check_vma=False
        )
    )


def resampling(args: argparse.Namespace, records: list[dict]) -> None:
    if args.smoke:
        n, dim, rounds, repeats = 64, 4, 3, 2
    else:
        n, dim, rounds, repeats = 4096, 100, 50, 7
    n, dim = args.particles or n, args.floats or dim
    rounds, repeats = args.rounds or rounds, args.repeats or repeats
    devices = args.num_devices
    mesh = mesh_for(devices)
    local = n // devices
    sharded = NamedSharding(mesh, P("chains"))
    x = jax.device_put(jax.random.normal(jax.random.key(args.seed), (n, dim)), sharded)
    # Log weights of an SMC stage (spread 1): a device needs a few rows of its neighbours.
    lw = jax.device_put(jax.random.normal(jax.random.key(args.seed + 1), (n,)), sharded)
    key = jax.random.key(args.seed + 2)
    caps = tuple(sorted({max(1, local // 16), max(1, local // 4)}))
    fns = {f"resample {s}": _looped_resample(s, rounds, mesh) for s in SCHEMES}
    fns["raw all_gather (systematic)"] = _raw("all_gather", rounds, mesh, n, caps)
    fns["raw neighbours (systematic)"] = _raw("neighbours", rounds, mesh, n, caps)
    raw_a, _ = fns["raw all_gather (systematic)"](key, lw, x)
    raw_n, widest = fns["raw neighbours (systematic)"](key, lw, x)
    same = bool(np.array_equal(np.asarray(raw_a), np.asarray(raw_n)))
    branch = int(np.asarray(widest).max())
    ours = np.asarray(fns["resample systematic"](key, lw, x))
    same_as_ours = bool(np.array_equal(ours, np.asarray(raw_a)))
    times = interleaved(fns, {name: (key, lw, x) for name in fns}, repeats, 1)
    row_bytes = 4 * dim
    gathered = (devices - 1) * local * (row_bytes + 4) / 1e6  # particles and log weights
    # What `resample`'s `chain_take` receives: the neighbours' blocks when every ancestor
    # (of the first round's key, all schemes sorted) lies within one block of its device's.
    weights = (devices - 1) * local * 4 / 1e6
    for name, (t_min, t_median) in times.items():
        received = gathered
        note = ""
        if name.startswith("resample "):
            a = np.asarray(ancestors(jax.random.fold_in(key, 0), lw, name.split()[1]))
            start = (np.arange(n) // local) * local
            if np.all((a >= start - local) & (a < start + 2 * local)):
                received = weights + 2 * local * row_bytes / 1e6
                note = "chain_take: the neighbours' blocks"
            else:
                note = "chain_take: fell back to all_gather"
        if name.startswith("raw neighbours"):
            if branch < len(caps):
                c = caps[branch]
                received = (2 * c * row_bytes + (devices - 1) * local * 4) / 1e6
                note = f"{c}-row prefix/suffix; same bits: {same}"
            else:
                note = f"fell back to all_gather; same bits: {same}"
        elif name.startswith("raw all_gather"):
            note = f"same bits as resample: {same_as_ours}"
        emit(
            {
                "benchmark": BENCH,
                "part": "resampling",
                "impl": name,
                "devices": devices,
                "particles": n,
                "dim": dim,
                "rounds": rounds,
                "ms": 1e3 * t_min / rounds,
                "ms_median": 1e3 * t_median / rounds,
                "mb_received": received * (devices > 1),
                "note": note,
                "load": os.getloadavg()[0],
            },
            records,
        )


# --- samplers.SMC vs BlackJAX ------------------------------------------------------------


class _Conjugate:
    """Prior N(0, I_d); y_j ~ N(x_j, 1): log Z = sum_j log N(y_j; 0, 2)."""

    def __init__(self, dim: int, seed: int):
        rng = np.random.default_rng(seed)
        self.y = np.asarray(rng.normal(0.0, np.sqrt(2.0), dim), np.float32)
        self.log_z = float(
            np.sum(-0.5 * self.y.astype(np.float64) ** 2 / 2 - 0.5 * np.log(4 * np.pi))
        )
        y = jnp.asarray(self.y)
        half_log_2pi = 0.5 * np.log(2 * np.pi)
        self.log_prior = lambda x: -0.5 * jnp.sum(x**2) - dim * half_log_2pi
        self.log_likelihood = lambda x: -0.5 * jnp.sum((x - y) ** 2) - dim * half_log_2pi


def _ours(target: _Conjugate, dim: int, steps: int, mesh: Any) -> Any:
    smc = samplers.SMC(
        samplers.RandomWalk(step_size=2.38 / np.sqrt(dim)),
        num_mutation_steps=steps,
        target_ess=0.5,
        resampling="systematic",
        metric="diagonal",
    )

    def go(key: Any, x0: Any) -> tuple[float, int, float]:
        result = smc.run(target.log_prior, target.log_likelihood, x0, key=key, mesh=mesh)
        return result.log_evidence, len(result.temperatures) - 1, result.log_evidence_se

    return go


def _blackjax(target: _Conjugate, dim: int, steps: int) -> Any:
    import blackjax
    from blackjax.mcmc.random_walk import normal
    from blackjax.smc.tuning.from_particles import particles_stds

    walk = blackjax.additive_step_random_walk.build_kernel()
    factor = 2.38 / np.sqrt(dim)

    def step_fn(key: Any, state: Any, logdensity: Any, scale: Any) -> Any:
        return walk(key, state, logdensity, normal(scale))

    def update(key: Any, state: Any, info: Any) -> dict:
        return {"scale": (factor * particles_stds(state.particles))[None]}

    algorithm = blackjax.inner_kernel_tuning(
        smc_algorithm=blackjax.adaptive_tempered_smc,
        logprior_fn=target.log_prior,
        loglikelihood_fn=target.log_likelihood,
        mcmc_step_fn=step_fn,
        mcmc_init_fn=blackjax.additive_step_random_walk.init,
        resampling_fn=blackjax.smc.resampling.systematic,
        mcmc_parameter_update_fn=update,
        initial_parameter_value={"scale": jnp.full((1, dim), factor, jnp.float32)},
        num_mcmc_steps=steps,
        target_ess=0.5,
    )

    @jax.jit
    def whole(key: Any, x0: Any) -> tuple:
        state = algorithm.init(x0)
        inner = state.sampler_state._replace(tempering_param=jnp.float32(0.0))
        state = state._replace(sampler_state=inner)

        def body(carry: tuple) -> tuple:
            key, state, log_z, stages = carry
            key, sub = jax.random.split(key)
            state, info = algorithm.step(sub, state)
            return key, state, log_z + info.log_likelihood_increment, stages + 1

        def more(carry: tuple) -> Any:
            return (carry[1].sampler_state.tempering_param < 1.0) & (carry[3] < 1000)

        _, _, log_z, stages = lax.while_loop(more, body, (key, state, jnp.float32(0), 0))
        return log_z, stages

    def go(key: Any, x0: Any) -> tuple[float, int, float]:
        log_z, stages = whole(key, x0)
        return float(log_z), int(stages), float("nan")

    return go


def tempered(args: argparse.Namespace, records: list[dict]) -> None:
    import time

    if args.smoke:
        dims, n, steps, seeds = (3,), 64, 2, 2
    else:
        dims, n, steps, seeds = (10, 100), 1024, 10, 5
    dims = tuple(int(d) for d in args.dims.split(",")) if args.dims else dims
    n, steps = args.smc_particles or n, args.mutation_steps or steps
    seeds = args.seeds or seeds
    devices = args.num_devices
    mesh = mesh_for(devices)
    peer = not args.skip_peer and have("blackjax")
    for dim in dims:
        target = _Conjugate(dim, args.seed)
        sides = {"ensemblenn": _ours(target, dim, steps, mesh)}
        if peer:
            sides["blackjax"] = _blackjax(target, dim, steps)
        elif not args.skip_peer:
            emit(skipped(BENCH, "blackjax", "blackjax", part="smc", dim=dim), records)
        runs: dict[str, list] = {name: [] for name in sides}
        loads = []
        errors: dict[str, str] = {}
        for seed in range(-1, seeds):  # seed -1: the warm-up (compilation) run
            key = jax.random.key(1000 + max(seed, 0))
            x0 = jax.random.normal(jax.random.fold_in(key, 1), (n, dim))
            order = list(sides) if seed % 2 == 0 else list(sides)[::-1]
            for name in order:
                if name in errors:
                    continue
                try:
                    t0 = time.perf_counter()
                    log_z, stages, se = sides[name](jax.random.fold_in(key, 2), x0)
                    elapsed = time.perf_counter() - t0
                except Exception as err:  # noqa: BLE001 - reported in the row
                    errors[name] = error_text(err)
                    continue
                if seed >= 0:
                    runs[name].append((elapsed, stages, log_z, se))
            loads.append(os.getloadavg()[0])
        for name in sides:
            base = {"benchmark": BENCH, "part": "smc", "impl": name, "devices": devices,
                    "particles": n, "dim": dim, "steps": steps, "load": max(loads)}  # fmt: skip
            if name in errors:
                emit({**base, "status": "crashed", "error": errors[name]}, records)
                continue
            t, stages, log_z, se = (np.asarray(v, np.float64) for v in zip(*runs[name]))
            per = t / (stages * n * steps) * 1e6
            err = log_z - target.log_z
            emit(
                {
                    **base,
                    "stages": float(np.mean(stages)),
                    "us_per_mutation": float(per.min()),
                    "us_per_mutation_median": float(np.median(per)),
                    "seconds_median": float(np.median(t)),
                    "log_z_exact": target.log_z,
                    "log_z_error": float(err.mean()),
                    "log_z_sd": float(err.std(ddof=1)) if len(err) > 1 else None,
                    "log_z_se": float(np.mean(se)) if np.isfinite(se).all() else None,
                },
                records,
            )


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    records: list[dict] = []
    parts = set(args.parts.split(","))
    if "resampling" in parts:
        resampling(args, records)
    if "smc" in parts:
        tempered(args, records)
    return records
