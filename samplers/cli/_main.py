"""The command line: `python -m samplers run --target NAME --sampler NAME ...`.

The device count must be fixed before JAX starts, so this module parses and checks the
arguments and sets XLA_FLAGS before importing anything that imports jax. Every error of
the library or of the arguments is one `error: ...` line on stderr and exit code 2; Ctrl-C
is exit code 130 with the step reached (and, with `--checkpoint`, how to resume).
"""

import argparse
import os
import sys
import time
import warnings

from . import _smc
from ._kernels import FIXED_DIM, METRICS, SAMPLERS, TARGETS

EXIT_ERROR, EXIT_NOT_CONVERGED, EXIT_INTERRUPTED = 2, 1, 130


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


# In a help text that states its default in words: an empty field that tells argparse's
# defaults formatter not to append "(default: None)" after it.
_DEFAULT_STATED = "%(default).0s"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error: ...` line (exit 2), like every error."""

    def error(self, message: str):
        self.exit(EXIT_ERROR, f"error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m samplers",
        description="Sample a standard target with an ensemble of chains, sharded over devices.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    targets = "\n".join(f"  {name:17} {text}" for name, text in TARGETS.items())
    run = sub.add_parser(
        "run",
        help="run an ensemble and print its diagnostics and verdict",
        formatter_class=_Formatter,
        description="Run an ensemble of chains on a target, tuned by default, and print its "
        "diagnostics and a verdict (converged: max R-hat < 1.01 (nested R-hat with "
        "superchains), min ESS >= 400, no divergences, acceptance in [0.05, 0.995] for "
        "adjusted kernels).\n\ntargets:\n" + targets,
    )
    add = run.add_argument
    add("--target", choices=tuple(TARGETS), default="gaussian", help="the distribution")
    add("--dim", type=int, default=None,
        help="target dimension (default: 100 gaussian, 36 rosenbrock, 20 funnel, 10 bimodal "
        "and logistic; banana is 2-d)" + _DEFAULT_STATED)  # fmt: skip
    add("--sampler", choices=(*SAMPLERS, "smc"), default="laps",
        help="the kernel; smc: Sequential Monte Carlo from a wide prior, with log Z (its "
        "flags below)")  # fmt: skip
    add("--adaptation", choices=("default", "none"), default="default",
        help="'default' tunes the kernel during --warmup (WindowAdaptation for "
        "rwm/mala/hmc/ghmc/nuts/adjusted-mclmc, LAPS's phase 1 for mclmc, LAPS for laps); "
        "'none' runs the fixed step size 0.5 and --warmup plain warmup steps")  # fmt: skip
    add("--metric", choices=("auto", "diagonal", "gradient", "dense", "none"), default="auto",
        help="the metric WindowAdaptation estimates: 'auto' is dense for mala and ghmc up "
        "to 100 dimensions (one gradient step per transition: it undoes correlations), "
        "else diagonal; 'gradient' is sqrt(Var[x] / Var[grad]) per coordinate; rwm and "
        "adjusted-mclmc take no dense metric; 'none' tunes the step size alone")  # fmt: skip
    add("--chains", type=int, default=256, help="number of chains (a multiple of --devices)")
    add("--steps", type=int, default=1000, help="sampling steps per chain (moments cover these)")
    add(
        "--warmup",
        type=int,
        default=500,
        help="tuning steps per chain before sampling (with --adaptation none: warmup steps)",
    )
    add("--devices", type=int, default=4, help="simulated CPU devices to shard the chains over")
    add("--seed", type=int, default=0, help="seed of the initial positions and the run")
    add("--superchain-size", type=int, default=None, metavar="K",
        help="chains per superchain for nested R-hat (default: chains // 16 when that "
        "divides, else chains // 8, else none); 0 turns nested R-hat off"
        + _DEFAULT_STATED)  # fmt: skip
    add("--strict", action="store_true", help="exit with code 1 when the run is NOT CONVERGED")
    add("--explain", action="store_true",
        help="after the output, explain each of its lines and columns")  # fmt: skip
    add("--out", default=None, metavar="DIR",
        help="folder for diagnostics.json and convergence.png (the plot needs matplotlib; "
        "with --out, b² is tracked at every step for it)")  # fmt: skip
    add("--no-progress", action="store_true", help="no progress bar (shown only on a terminal)")
    add("--no-cache", action="store_true",
        help="do not use JAX's persistent compilation cache (by default compiled programs are "
        "kept in ~/.cache/ensemblenn/jax, so a later run skips most compilation)")  # fmt: skip
    add("--block-size", type=_block_size, default=None, metavar="N",
        help="chains per compiled block, for results that are the same bit for bit on any "
        "device count (samplers.run's block_size); auto is chains // 8; by default (0) each "
        "device's chains run in one batch, fastest, the same to rounding")  # fmt: skip
    add(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="save the run in DIR as it goes, so that --resume can continue it",
    )
    add(
        "--resume",
        action="store_true",
        help="continue the run saved in --checkpoint DIR (or start it afresh)",
    )
    _smc.add_arguments(run)
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


def superchain_size(args: argparse.Namespace) -> int | None:
    """The superchain size for nested R-hat: `--superchain-size` (0: none, passed on so
    that samplers.run does not pick superchains by itself), or 16 (else 8) superchains
    when the chains split evenly into superchains of at least 2."""
    if args.superchain_size is not None:
        return args.superchain_size
    for groups in (16, 8):
        if args.chains % groups == 0 and args.chains // groups >= 2:
            return args.chains // groups
    return None


def _check_metric(args: argparse.Namespace) -> str | None:
    """`--metric` for a sampler that cannot take it (`METRICS`)."""
    if args.sampler == "smc":
        return None  # _smc.check_arguments: SMC's own metrics
    allowed = METRICS[args.sampler]
    if args.metric == "auto" or args.metric in allowed:
        return None
    if not allowed:
        if args.adaptation != "default":
            return None  # no tuning at all: the metric is not used
        return (
            f"--metric {args.metric}: --sampler {args.sampler} is tuned by LAPS's own rules, "
            "not WindowAdaptation; fix: leave --metric at auto"
        )
    if args.metric == "dense":
        dense = "/".join(name for name, metrics in METRICS.items() if "dense" in metrics)
        return (
            f"--metric dense: --sampler {args.sampler} takes a diagonal metric only; fix: "
            f"--metric diagonal (or auto), or --sampler {dense}"
        )
    if args.metric == "gradient":
        return (
            f"--metric gradient: --sampler {args.sampler} computes no gradients; fix: "
            "--metric diagonal (or auto)"
        )
    return None


def _check_dim(args: argparse.Namespace) -> str | None:
    """`--dim` that the target cannot take."""
    if args.dim is not None:
        if args.dim < 1:
            return f"--dim must be >= 1, got {args.dim}"
        fixed = FIXED_DIM.get(args.target)
        if fixed is not None and args.dim != fixed:
            return f"--target {args.target} is {fixed}-d; fix: leave out --dim"
        if args.target == "rosenbrock" and args.dim % 2:
            return f"--target rosenbrock needs an even --dim (x, y pairs), got {args.dim}"
        if args.target == "funnel" and args.dim < 2:
            return f"--target funnel needs --dim >= 2 (θ and at least one z), got {args.dim}"
    return None


def check_arguments(args: argparse.Namespace) -> str | None:
    """The first problem with the arguments (a message), or None; checked before JAX starts."""
    bounds = (("--chains", args.chains, 1), ("--steps", args.steps, 1),
              ("--warmup", args.warmup, 0), ("--devices", args.devices, 1))  # fmt: skip
    for flag, value, low in bounds:
        if value < low:
            return f"{flag} must be >= {low}, got {value}"
    if args.chains % args.devices:
        return (
            f"--chains {args.chains} is not a multiple of --devices {args.devices} (the chains "
            f"are split evenly over the devices); fix: e.g. --chains "
            f"{max(1, args.chains // args.devices) * args.devices}"
        )
    for check in (_check_metric, _check_dim):
        problem = check(args)
        if problem:
            return problem
    if args.superchain_size is not None:
        k = args.superchain_size
        if k < 0 or (k and args.chains % k) or (k and args.chains // k < 2):
            return (
                f"--superchain-size {k} must divide --chains {args.chains} into at least 2 "
                "superchains (or be 0: no nested R-hat)"
            )
    if args.resume and not args.checkpoint:
        return "--resume needs --checkpoint DIR"
    return None


def one_line(err: BaseException) -> str:
    """An error message on one line (the library's "\\n  fix: ..." joined in)."""
    return " ".join(str(err).split()) or type(err).__name__


def start_jax(devices: int, cache: bool) -> None:
    """Set the device count (before JAX is imported) and the compilation cache."""
    flags = os.environ.get("XLA_FLAGS", "")  # the last occurrence of a flag wins
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if not cache:  # else samplers.run's default: JAX's cache folder if set, else ours
        import samplers

        samplers.enable_compilation_cache(False)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problem = check_arguments(args) or _smc.check_arguments(args, _smc.given(parser(), argv))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_ERROR
    try:
        start_jax(args.devices, cache=not args.no_cache)
        return _smc.run(args) if args.sampler == "smc" else _run(args)
    except KeyboardInterrupt as err:
        if args.sampler == "smc":
            print(_smc.interrupted(args), file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        return _interrupted(args, getattr(err, "step", None))
    except Exception as err:
        import ensemblenn as enn

        if isinstance(err, enn.EnsembleError | _checkpoint_error()):
            print(f"error: {one_line(err)}", file=sys.stderr)
            return EXIT_ERROR
        raise


def _checkpoint_error() -> type:
    from ..checkpoint import CheckpointError

    return CheckpointError


def _interrupted(args: argparse.Namespace, step: int | None) -> int:
    at = "" if step is None else f" at step {step}"
    message = f"interrupted{at}"
    if args.checkpoint:
        from .. import checkpoint

        try:
            saved = checkpoint.inspect(args.checkpoint)["step"]
        except Exception:  # nothing saved yet (interrupted before the first save)
            saved = None
        if saved is None:
            message += "; nothing was saved yet, so a rerun starts afresh"
        else:
            message += f"; the checkpoint holds step {saved}: rerun with --resume"
    print(message, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    import jax

    import samplers

    from ..driver import verdict_of
    from . import _report as report
    from ._kernels import make_sampler, make_target

    target = make_target(args.target, args.dim)
    adapt = args.adaptation == "default"
    sampler, adaptation, described = make_sampler(
        args.sampler, adapt, args.warmup, args.metric, target.dim
    )
    k = superchain_size(args)
    key = jax.random.key(args.seed)
    k_init, k_run = jax.random.split(key)
    positions = jax.vmap(target.initial_position)(jax.random.split(k_init, args.chains))
    report.preamble(args, target, described, k)
    resumed_from, earlier_seconds = None, 0.0
    if args.resume and os.path.isfile(os.path.join(args.checkpoint, samplers.checkpoint.FILENAME)):
        saved = samplers.checkpoint.inspect(args.checkpoint)
        resumed_from = saved["step"]
        earlier_seconds = float(saved.get("wall_seconds") or 0.0)  # the runs it continues
        print(f"resuming from the checkpoint at step {resumed_from}", flush=True)
    tick = time.perf_counter()
    with warnings.catch_warnings():
        # The CLI prints the verdict itself (and --strict acts on it).
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        result = samplers.run(
            sampler, target, positions, key=k_run, num_steps=args.steps,
            num_warmup=0 if adaptation is not None else args.warmup, adaptation=adaptation,
            superchain_size=k, track_bias=args.out is not None,
            progress=not args.no_progress and sys.stderr.isatty(),
            checkpoint_dir=args.checkpoint, resume=args.resume, block_size=args.block_size,
        )  # fmt: skip
    jax.block_until_ready(result.state.position)
    seconds = earlier_seconds + time.perf_counter() - tick  # the whole run, across resumes
    report.results(args, result, seconds)
    if args.out:
        report.write_out(args, result, seconds, resumed_from)
    verdict = verdict_of(result, hints="cli")  # its fixes name the flags
    print(f"verdict: {verdict.line}")
    if args.strict and not verdict.converged:
        return EXIT_NOT_CONVERGED
    return 0
