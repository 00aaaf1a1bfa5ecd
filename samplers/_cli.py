"""The command line: `python -m samplers run --target NAME --sampler NAME ...`.

The device count must be fixed before JAX starts, so this module parses the arguments
and sets XLA_FLAGS before importing anything that imports jax.
"""

import argparse
import json
import os
import sys
import time
from typing import Any

TARGETS = ("gaussian", "rotated-gaussian", "banana", "rosenbrock", "funnel", "bimodal", "logistic")
SAMPLERS = ("rwm", "mala", "hmc", "mclmc", "adjusted-mclmc", "laps")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m samplers", description="Sample a standard target with an ensemble."
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an ensemble and print its diagnostics")
    run.add_argument("--target", choices=TARGETS, default="gaussian")
    run.add_argument("--dim", type=int, default=None, help="target dimension, if it has one")
    run.add_argument("--sampler", choices=SAMPLERS, default="laps")
    run.add_argument("--chains", type=int, default=256)
    run.add_argument("--steps", type=int, default=1000)
    run.add_argument("--warmup", type=int, default=500)
    run.add_argument("--devices", type=int, default=4, help="simulated CPU devices")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--out",
        default=None,
        help="folder for diagnostics.json and convergence.png (the plot needs "
        "matplotlib; with --out, b² is tracked at every step for it)",
    )
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--block-size",
        type=_block_size,
        default="auto",
        metavar="N",
        help="chains per compiled block, for results that are the same on any "
        "device count (samplers.run's block_size); 0 runs each device's "
        "chains in one batch (default: auto, chains // 8)",
    )
    run.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="save the run in DIR as it goes, so that --resume can continue it",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run saved in --checkpoint DIR (or start it afresh)",
    )
    return p


def _block_size(text: str) -> int | str | None:
    if text == "auto":
        return "auto"
    if text in ("0", "none", "None"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a block size: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"block size must be >= 0, got {value}")
    return value or None


def make_target(name: str, dim: int | None) -> Any:
    from . import targets

    if name in ("gaussian", "rotated-gaussian"):
        return targets.IllConditionedGaussian(
            dim=dim or 100, condition_number=100.0, rotated=name == "rotated-gaussian"
        )
    if name == "banana":
        return targets.Banana()
    if name == "rosenbrock":
        return targets.Rosenbrock()
    if name == "funnel":
        return targets.NealsFunnel(dim=dim or 20)
    if name == "bimodal":
        return targets.BimodalGaussian(dim=dim or 10)
    return targets.LogisticRegression()


def make_sampler(name: str, target: Any) -> tuple[Any, Any]:
    """(sampler, adaptation) with reasonable defaults for the target's scale."""
    import samplers

    if name == "laps":
        return None, samplers.LAPS()
    scale = 0.5
    table = {
        "rwm": lambda: samplers.RandomWalk(step_size=scale),
        "mala": lambda: samplers.MALA(step_size=scale),
        "hmc": lambda: samplers.HMC(step_size=scale, num_integration_steps=10),
        "mclmc": lambda: samplers.MCLMC(step_size=scale, L=3.0),
        "adjusted-mclmc": lambda: samplers.AdjustedMCLMC(step_size=scale, num_integration_steps=10),
    }
    return table[name](), None


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.resume and not args.checkpoint:
        cli.error("--resume needs --checkpoint DIR")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    import samplers

    target = make_target(args.target, args.dim)
    sampler, adaptation = make_sampler(args.sampler, target)
    key = jax.random.key(args.seed)
    k_init, k_run = jax.random.split(key)
    positions = jax.vmap(target.initial_position)(jax.random.split(k_init, args.chains))
    print(
        f"{args.sampler} on {args.target} (d={target.dim}): {args.chains} chains, "
        f"{jax.device_count()} devices",
        flush=True,
    )
    resumed_from = None
    if args.resume and os.path.isfile(os.path.join(args.checkpoint, samplers.checkpoint.FILENAME)):
        resumed_from = samplers.checkpoint.inspect(args.checkpoint)["step"]
        print(f"resuming from the checkpoint at step {resumed_from}", flush=True)
    tick = time.perf_counter()
    try:
        result = samplers.run(
            sampler,
            target,
            positions,
            key=k_run,
            num_steps=args.steps,
            num_warmup=0 if adaptation is not None else args.warmup,
            adaptation=adaptation,
            superchain_size=4,
            track_bias=args.out is not None,
            progress=not args.no_progress and sys.stderr.isatty(),
            checkpoint_dir=args.checkpoint,
            resume=args.resume,
            block_size=args.block_size,
        )
    except samplers.CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    jax.block_until_ready(result.state.position)
    seconds = time.perf_counter() - tick
    result.summary()
    print(f"wall time {seconds:.1f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        from ._plots import convergence_plot

        note = convergence_plot(
            result, os.path.join(args.out, "convergence.png"), f"{args.sampler} on {args.target}"
        )
        if note:
            print(f"note: {note}")
        report = _diagnostics_json(result, seconds)
        report.update(
            sampler=args.sampler,
            target=args.target,
            devices=jax.device_count(),
            checkpoint=args.checkpoint,
            resumed_from_step=resumed_from,
            plot=None if note else "convergence.png",
            plot_note=note,
        )
        with open(os.path.join(args.out, "diagnostics.json"), "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.out}/diagnostics.json" + ("" if note else " and convergence.png"))
    return 0


def _diagnostics_json(result: Any, seconds: float) -> dict:
    import jax
    import numpy as np

    d = result.diagnostics

    def listify(x: Any) -> Any:  # a pytree's coordinates in the order of `names`
        leaves = [np.ravel(np.asarray(v)) for v in jax.tree.leaves(x)]
        return None if x is None else np.concatenate(leaves).tolist()

    return {
        "num_chains": result.num_chains,
        "names": list(result.names),
        "num_steps": result.num_steps,
        "wall_seconds": seconds,
        "acceptance_rate": float(np.mean(result.acceptance_rate)),
        "num_divergent": int(np.sum(result.num_divergent)),
        "rhat": listify(d.rhat),
        "nested_rhat": listify(d.nested_rhat),
        "ess": listify(d.ess),
        "bias_squared_max": None if d.bias_squared_max is None else float(d.bias_squared_max),
        "bias_squared_mean": None if d.bias_squared_mean is None else float(d.bias_squared_mean),
    }
