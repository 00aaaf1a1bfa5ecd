"""What the command line prints and writes: the target, the run, every number explained."""

import argparse
import json
import os
from typing import Any

import jax
import numpy as np

from ._kernels import TARGETS


def preamble(args: argparse.Namespace, target: Any, described: str, superchains: int | None):
    """What is about to run, before it runs."""
    import jax

    draws = args.chains * args.steps
    print(f"target   {args.target} (d={target.dim}): {TARGETS[args.target]}")
    print(f"sampler  {args.sampler}: {described}")
    nested = f", nested R-hat over superchains of {superchains}" if superchains else ""
    print(
        f"run      {args.chains} chains on {jax.device_count()} device(s), {args.warmup} "
        f"warmup/tuning + {args.steps} sampling steps each ({draws} sampling draws{nested})",
        flush=True,
    )


LEGEND = """\
how to read it:
  verdict       CONVERGED only if max R-hat < 1.01 (nested R-hat with superchains), min ESS
                >= 400, no divergent transitions and, for Metropolis-adjusted kernels, an
                acceptance in [0.05, 0.995]; else NOT CONVERGED with each failed check and
                the flag that fixes it
  acceptance    mean Metropolis acceptance probability over all chains and steps (1 for
                unadjusted kernels: mclmc)
  divergent     transitions whose energy error blew up (step too large for the geometry)
  grads/chain   gradient evaluations per chain (sampling; "+ N adapting" for the tuning)
  mean, sd      the ensemble's estimates of each coordinate's mean and standard deviation
  ESS (mean)    effective sample size of the mean per dimension, all chains' sampling draws
                together, from their moments: the verdict's ESS (compare with the number
                of draws: ESS / draws is the efficiency; it may exceed the draws when
                successive draws are anti-correlated)
  R-hat (split) split R-hat per dimension: spread between chain halves vs within them, 1 at
                convergence; with many short chains it stays ~1 + tau/steps above 1 even
                when converged (tau: autocorrelation time), so read nested R-hat then
  R-hat         R-hat of superchains (consecutive groups of chains): 1 once the chains
  (nested)      have forgotten their starting points; the criterion for many short chains
  verdict read  which of the two R-hats the verdict read
  bias^2        b² of E[x²]: the squared error of the ensemble's second moments in units of
                their variance, max and mean over dimensions; ~1/ESS for an unbiased run,
                < 0.01 is about 100 effective samples (needs the target's exact moments)"""


def results(args: argparse.Namespace, result: Any, seconds: float) -> None:
    """The summary (verdict first, its fixes naming flags), ESS against the draws, and
    the legend with `--explain` (else one line saying that it explains the output)."""
    result.summary(hints="cli")
    draws = result.num_chains * result.num_steps
    ess = np.asarray(result.diagnostics.ess, dtype=np.float64)
    print(
        f"ESS      min {np.nanmin(ess):.0f}, median {np.nanmedian(ess):.0f} of {draws} "
        f"sampling draws ({100 * np.nanmin(ess) / draws:.1f} % at worst)"
    )
    print(f"time     {seconds:.1f} s wall, compilation and tuning included")
    print(LEGEND if getattr(args, "explain", False) else EXPLAIN_HINT)


EXPLAIN_HINT = "(--explain explains each line and column)"


def write_out(args: argparse.Namespace, result: Any, seconds: float, resumed_from: Any) -> None:
    """diagnostics.json and convergence.png in `--out`."""
    import jax

    from .._plots import convergence_plot

    os.makedirs(args.out, exist_ok=True)
    note = convergence_plot(
        result, os.path.join(args.out, "convergence.png"), f"{args.sampler} on {args.target}"
    )
    if note:
        print(f"note: {note}")
    data = diagnostics_json(result, seconds)
    data.update(
        sampler=args.sampler,
        target=args.target,
        adaptation=args.adaptation,
        devices=jax.device_count(),
        checkpoint=args.checkpoint,
        resumed_from_step=resumed_from,
        plot=None if note else "convergence.png",
        plot_note=note,
    )
    with open(os.path.join(args.out, "diagnostics.json"), "w") as f:
        json.dump(data, f, indent=2, default=_plain)
    print(f"wrote {args.out}/diagnostics.json" + ("" if note else " and convergence.png"))


def _plain(value: Any) -> Any:
    """numpy/JAX scalars and arrays (e.g. a verdict reason's value) as JSON numbers/lists."""
    return np.asarray(value).tolist()


def diagnostics_json(result: Any, seconds: float) -> dict:
    """The run's numbers and verdict as JSON-ready values."""
    from ..driver import verdict_of

    d = result.diagnostics
    verdict = verdict_of(result, hints="cli")

    def listify(x: Any) -> Any:  # a pytree's coordinates, in the order of `names`
        if x is None:
            return None
        if isinstance(x, jax.Array | np.ndarray | float) and np.ndim(x) == 0:
            return float(x)  # a scalar such as b²
        return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(x)]).tolist()

    return {
        "converged": verdict.converged,
        "names": list(result.names),
        "verdict": verdict.line,
        "reasons": [r._asdict() for r in verdict.reasons],
        "num_chains": result.num_chains,
        "num_steps": result.num_steps,
        "num_draws": result.num_chains * result.num_steps,
        "wall_seconds": seconds,
        "acceptance_rate": float(np.mean(result.acceptance_rate)),
        "num_divergent": int(np.sum(result.num_divergent)),
        "rhat": listify(d.rhat),
        "nested_rhat": listify(d.nested_rhat),
        "ess": listify(d.ess),
        "bias_squared_max": listify(d.bias_squared_max),
        "bias_squared_mean": listify(d.bias_squared_mean),
    }
