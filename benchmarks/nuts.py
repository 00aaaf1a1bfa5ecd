"""NumPyro NUTS (4 chains, warmup counted) vs samplers.LAPS (many chains) on gauss100.

The question is the one the LAPS paper asks: how many gradient evaluations per chain (the
wall-clock proxy on parallel hardware) and how much wall time until the estimate of E[x²]
is accurate, b²_mean < 0.01 and b²_max < 0.05 (b² in units of Var[x²], ~ 1/ESS).

* NUTS: `MCMC(NUTS(potential_fn=...), num_warmup=W, num_samples=S, num_chains=4)`, chain
  method "parallel" when there are at least 4 devices (else "vectorized"); the estimate
  after n draws is the average of x² over the 4 chains' first n post-warmup draws, and its
  cost is the warmup's gradients plus the draws' (NUTS `num_steps`, per chain, averaged).
* LAPS: `samplers.run(None, ..., adaptation=samplers.LAPS(), track_bias=True)` with its
  default settings (early stop on); the estimate at a step is the mean of x² over all
  chains at that step. The b² of the adaptation steps is not reported by samplers.LAPS, so
  the count starts at the first sampling step: an upper bound.

Both start from N(0, I). Wall time is for a first call in a fresh process, compilation
included (`compile_s` is the part JAX reports as compilation); "to threshold" wall time
scales the sampling part by the fraction of its gradients used.
"""

import argparse
from typing import Any

import jax
import numpy as np

import samplers

from ._common import (
    clock,
    emit,
    error_text,
    gaussian,
    grads_to_stay_below,
    have,
    iid_floor,
    mesh_for,
    print_machine,
    skipped,
)

BENCH = "nuts"
AVG, MAX = 0.01, 0.05

COLUMNS = [
    ("impl", "impl", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("grads_per_chain", "grads/chain (total)", ".0f"),
    ("wall_s", "wall s", ".1f"),
    ("compile_s", "compile s", ".1f"),
    ("grads_to_avg", "grads to b²mean<0.01", ".0f"),
    ("grads_to_max", "grads to b²max<0.05", ".0f"),
    ("wall_to_both_s", "wall s to both", ".1f"),
    ("b2_max", "final b²max", ".4f"),
    ("b2_mean", "final b²mean", ".4f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="LAPS chains (default 512)")
    p.add_argument("--warmup", type=int, default=None, help="NUTS warmup (default 500)")
    p.add_argument("--samples", type=int, default=None, help="NUTS draws (default 1000)")
    p.add_argument(
        "--laps-samples",
        type=int,
        default=None,
        help="LAPS sampling steps after adaptation (default 50)",
    )
    p.add_argument("--dim", type=int, default=None)


def _b2(estimate: np.ndarray, ref: Any) -> tuple[np.ndarray, np.ndarray]:
    b2 = (estimate - np.asarray(ref.second_moment)) ** 2 / np.asarray(ref.second_moment_var)
    return b2.max(axis=-1), b2.mean(axis=-1)


def _nuts(target: Any, warmup: int, samples: int, seed: int) -> dict:
    from numpyro.infer import MCMC, NUTS

    method = "parallel" if jax.local_device_count() >= 4 else "vectorized"
    mcmc = MCMC(
        NUTS(potential_fn=lambda x: -target(x)),
        num_warmup=warmup,
        num_samples=samples,
        num_chains=4,
        chain_method=method,
        progress_bar=False,
    )
    x0 = jax.random.normal(jax.random.key(seed), (4, target.dim))
    with clock() as total:
        with clock() as warm:
            mcmc.warmup(
                jax.random.key(seed + 1),
                init_params=x0,
                collect_warmup=True,
                extra_fields=("num_steps",),
            )
            warm_steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
        with clock() as draw:
            mcmc.run(mcmc.post_warmup_state.rng_key, extra_fields=("num_steps",))
            x = np.asarray(mcmc.get_samples(group_by_chain=True))  # (4, S, d)
            steps = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["num_steps"])
    warm_grads = float(warm_steps.sum(axis=1).mean()) + 1.0  # + the initial gradient
    grads = warm_grads + np.cumsum(steps, axis=1).mean(axis=0)  # (S,)
    running = np.cumsum((x**2).mean(axis=0), axis=0) / np.arange(1, x.shape[1] + 1)[:, None]
    b2_max, b2_mean = _b2(running, target.reference)
    to_avg = grads_to_stay_below(grads, b2_mean, AVG)
    to_max = grads_to_stay_below(grads, b2_max, MAX)
    both = None
    if to_avg is not None and to_max is not None:
        frac = (max(to_avg, to_max) - warm_grads) / max(grads[-1] - warm_grads, 1.0)
        both = warm.wall + max(frac, 0.0) * draw.wall
    return dict(
        chain_method=method,
        grads_per_chain=float(grads[-1]),
        warmup_grads_per_chain=warm_grads,
        wall_s=total.wall,
        compile_s=total.compile_s,
        warmup_s=warm.wall,
        sampling_s=draw.wall,
        grads_to_avg=to_avg,
        grads_to_max=to_max,
        wall_to_both_s=both,
        b2_max=float(b2_max[-1]),
        b2_mean=float(b2_mean[-1]),
        mean_tree_steps=float(steps.mean()),
    )


def _laps(target: Any, chains: int, samples_: int, seed: int, mesh: Any) -> dict:
    x0 = jax.random.normal(jax.random.key(seed), (chains, target.dim))
    with clock() as c:
        result = jax.block_until_ready(
            samplers.run(
                None,
                target,
                x0,
                key=jax.random.key(seed + 1),
                num_steps=samples_,
                adaptation=samplers.LAPS(),
                mesh=mesh,
                track_bias=True,
                chunk_size=samples_,
                progress=False,
            )
        )
    info = result.adaptation_info
    adapt = float(info.num_grads)
    sampled = float(np.mean(result.num_grads))
    grads = adapt + sampled / samples_ * np.arange(1, samples_ + 1)
    bias = np.asarray(result.bias_history)
    to_avg = grads_to_stay_below(grads, bias[:, 1], AVG)
    to_max = grads_to_stay_below(grads, bias[:, 0], MAX)
    both = None
    if to_avg is not None and to_max is not None:
        # wall time is dominated by compilation; scale the run part by gradients used
        run_part = c.wall - c.compile_s
        both = c.compile_s + run_part * max(to_avg, to_max) / (adapt + sampled)
    return dict(
        grads_per_chain=adapt + sampled,
        adaptation_grads=adapt,
        phase1_steps=int(info.num_steps1),
        stopped_early=bool(info.stopped_early),
        wall_s=c.wall,
        compile_s=c.compile_s,
        grads_to_avg=to_avg,
        grads_to_max=to_max,
        grads_le="yes",
        wall_to_both_s=both,
        b2_max=float(bias[-1, 0]),
        b2_mean=float(bias[-1, 1]),
    )


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        dim, chains, warmup, samples_, laps_samples = 6, 16, 30, 30, 5
    elif args.full:
        dim, chains, warmup, samples_, laps_samples = 100, 4096, 1000, 2000, 50
    else:
        dim, chains, warmup, samples_, laps_samples = 100, 512, 500, 1000, 50
    dim = args.dim or dim
    chains = args.chains or chains
    warmup = args.warmup or warmup
    samples_ = args.samples or samples_
    laps_samples = args.laps_samples or laps_samples
    n = args.num_devices
    target = gaussian(dim, 100.0)
    records: list[dict] = []
    common = dict(benchmark=BENCH, target=f"gauss{dim}", devices=n)
    row = dict(common, impl="samplers.LAPS", chains=chains)
    floor_max, floor_mean = iid_floor(target.reference, chains)
    row.update(iid_floor_b2_max=floor_max, iid_floor_b2_mean=floor_mean)
    try:
        row.update(_laps(target, chains, laps_samples, args.seed, mesh_for(n)))
    except Exception as err:  # noqa: BLE001 - reported as a row
        row.update(status="error", error=error_text(err))
    emit(row, records)
    if not have("numpyro"):
        emit(
            skipped(
                BENCH,
                "numpyro NUTS",
                "numpyro",
                **{k: v for k, v in common.items() if k != "benchmark"},
                chains=4,
            ),
            records,
        )
        return records
    row = dict(common, impl="numpyro NUTS", chains=4, warmup=warmup, samples=samples_)
    try:
        row.update(_nuts(target, warmup, samples_, args.seed))
    except Exception as err:  # noqa: BLE001 - reported as a row
        row.update(status="error", error=error_text(err))
    emit(row, records)
    return records
