"""`python -m samplers run --sampler smc`: adaptive tempered SMC on the command line's targets.

SMC needs the target split into a log prior and a log likelihood. Each command-line
target is a log density of its own, so it is split here: the prior is a wide Gaussian,
`N(m, (2 s)^2)` per coordinate with `m` and `s` the target's exact mean and standard
deviation (for the funnel those of its raw coordinates: `theta ~ N(0, 3^2)`, `z` with
variance `E[e^theta] = e^4.5`), and the likelihood is the target's log density minus that
log prior. The posterior is then the target itself, and log Z is relative to that prior:
both densities are normalised, so the exact log Z is 0. The logistic regression is split
as its model is: its own `N(0, I)` prior and the Bernoulli likelihood of the data, so log
Z is the data's log marginal likelihood (no closed form).

The flags that only mean something for chains (`--adaptation`, `--steps`, `--warmup`,
`--superchain-size`, `--metric gradient`) are argument errors with `--sampler smc`; the SMC
flags (`--mutation-kernel`, `--mutation-steps`) are errors with any other sampler. `_main`
calls `add_arguments`, `check_arguments`, `run` and `interrupted`; the rest is private.
"""

import argparse
import json
import math
import os
import sys
import textwrap
import time
from typing import Any

KERNELS = ("hmc", "mala", "rwm")
DEFAULT_KERNEL, DEFAULT_STEPS = "hmc", 5
# The flags of chains (argparse dests) that SMC has no use for: a given one is an error.
# Why each: what the fix line says.
CHAIN_ONLY = {
    "adaptation": (
        "--sampler smc tunes its mutation kernel at every stage from the particles (step "
        "size towards the target acceptance, metric from their spread): there is no "
        "warmup to adapt",
        "leave out --adaptation",
    ),
    "steps": (
        "--sampler smc runs no sampling steps per chain: it moves every particle "
        "--mutation-steps kernel steps per stage, from the prior to the target",
        "--mutation-steps N instead",
    ),
    "warmup": (
        "--sampler smc has no warmup: the tempering from the prior is what brings the "
        "particles to the target",
        "leave out --warmup",
    ),
    "superchain_size": (
        "--sampler smc computes no R-hat: its verdict reads each stage's ESS, the "
        "distinct particles and the lineages",
        "leave out --superchain-size",
    ),
}
FAR = 4.0  # log Z this many standard errors from the exact value is flagged
SMC_ONLY = {"mutation_kernel": "--mutation-kernel", "mutation_steps": "--mutation-steps"}


def add_arguments(run: argparse.ArgumentParser) -> None:
    """The `--sampler smc` flags, in a group of their own in `run --help`."""
    group = run.add_argument_group(
        "--sampler smc",
        textwrap.fill(  # the run parser keeps descriptions as written (raw)
            "Adaptive tempered Sequential Monte Carlo: --chains particles drawn from a wide "
            "Gaussian prior N(m, (2 s)^2) per coordinate (m, s: the target's exact mean and "
            "sd; logistic: its own N(0, I) prior) move to the target through tempered "
            "targets prior x likelihood^beta, the likelihood being the target's density over "
            "that prior. log Z is relative to that prior: 0 exactly for every target but "
            "logistic, whose log Z is the data's log marginal likelihood. bimodal also prints "
            "the recovered mode weights. Not with --adaptation, --steps, --warmup or "
            "--superchain-size.",
            width=88,
        ),
    )
    group.add_argument("--mutation-kernel", choices=KERNELS, default=DEFAULT_KERNEL,
                       help="the kernel that moves the particles at every stage, tuned per "
                       "stage (hmc: 1 to 15 leapfrog steps, mean 8)")  # fmt: skip
    group.add_argument("--mutation-steps", type=int, default=DEFAULT_STEPS, metavar="N",
                       help="kernel steps per particle and stage")  # fmt: skip


def given(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The flags (argparse dests) written on the command line, whatever their value:
    `argv` parsed again with every default suppressed (abbreviations count too)."""
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:  # argparse has no public walk over its actions
            if action.dest != "help":
                action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return set(vars(parser.parse_args(argv))) - {"command"}


def check_arguments(args: argparse.Namespace, written: set[str]) -> str | None:
    """The first problem of the SMC flags (a message with its fix), or None."""
    if args.sampler != "smc":
        for dest, flag in SMC_ONLY.items():
            if dest in written:
                return (
                    f"{flag} is a flag of --sampler smc, not of --sampler {args.sampler}; "
                    f"fix: --sampler smc, or leave out {flag}"
                )
        return None
    for dest, (why, fix) in CHAIN_ONLY.items():
        if dest in written:
            flag = "--" + dest.replace("_", "-")
            return f"{flag} with --sampler smc: {why}; fix: {fix}"
    if args.metric == "gradient":
        return (
            "--metric gradient with --sampler smc: SMC estimates its metric from the "
            "particles' spread at every stage; fix: --metric diagonal (or auto), dense or none"
        )
    if args.metric == "dense" and args.mutation_kernel == "rwm":
        return (
            "--metric dense: --mutation-kernel rwm takes a per-coordinate scale only; fix: "
            "--metric diagonal (or auto), or --mutation-kernel hmc"
        )
    if args.mutation_steps < 1:
        return (
            f"--mutation-steps must be >= 1, got {args.mutation_steps}; fix: e.g. "
            f"--mutation-steps {DEFAULT_STEPS} (the default)"
        )
    return None


def split(name: str, target: Any) -> tuple[Any, Any, str, float | None]:
    """`(mean, sd, what, exact)`: the Gaussian prior's mean and sd per coordinate, what it
    is in words, and the exact log Z (None: no closed form); see the module's docstring."""
    import jax.numpy as jnp
    import numpy as np

    dim = target.dim
    if name == "logistic":  # the model's own prior: log Z is the marginal likelihood
        mean, sd = jnp.zeros(dim), jnp.ones(dim)
        return mean, sd, "N(0, I), the regression's own prior", None
    if name == "funnel":  # its reference is of the Gaussianized coordinates
        var = jnp.concatenate([jnp.array([9.0]), jnp.full(dim - 1, math.exp(4.5))])
        mean, sd = jnp.zeros(dim), 2 * jnp.sqrt(var)
    else:
        ref = target.reference
        mean, sd = ref.mean, 2 * jnp.sqrt(ref.second_moment - ref.mean**2)
    sd = jnp.asarray(sd, jnp.float32)
    what = (
        f"N(m, (2 s)^2) per coordinate, m and s the target's mean and sd (prior sd "
        f"{float(np.min(sd)):.3g} to {float(np.max(sd)):.3g})"
    )
    return mean, sd, what, 0.0  # both densities normalised: Z = 1


def _kernel(name: str) -> Any:
    import samplers

    if name == "rwm":
        return samplers.RandomWalk(step_size=0.5)
    if name == "mala":
        return samplers.MALA(step_size=0.5)
    # A path length drawn per move (jitter) for the reason the MCMC samplers draw one
    # (`_kernels`): a fixed one resonates with a Gaussian's periods.
    return samplers.HMC(step_size=0.5, num_integration_steps=8, jitter=True)


def _metric(args: argparse.Namespace) -> str | None:
    return {"auto": "diagonal", "none": None}.get(args.metric, args.metric)


# The verdict's fixes in flags (SMCResult's name SMC's arguments): criterion -> fix.
CLI_FIXES = {
    "schedule": "more --mutation-steps (better-mixed particles give less extreme weights)",
    "ess": "more --chains (particles)",
    "lineages": "more --chains (particles)",
    "distinct": "more --mutation-steps, or --mutation-kernel hmc",
    "acceptance": "--mutation-kernel hmc, or more --chains (a better-estimated metric)",
}

LEGEND = """\
how to read it:
  SMC           particles, stages (tempered targets) from the prior to temperature 1, the
                mutation kernel and its steps per particle and stage
  log Z         the log evidence, relative to the prior printed above, +/- its standard
                error (from the particles' genealogy); 'exact' where a closed form exists
  stage ESS     the least effective sample size of a stage's reweighting (the adaptive
                schedule aims at half the particles); mean acceptance of the moves
  mean, sd ...  the final particles' mean, sd and 5%/95% quantiles per coordinate (equally
                weighted draws of the target)
  modes         (bimodal) the particles' share in each mode, +/- its Monte Carlo standard
                error (grouped by lineage)
  verdict       CONVERGED only if the schedule reached temperature 1, no stage's ESS fell
                below 10% of the particles, the last stage's ESS >= 100, at least half the
                final particles are distinct, the mean acceptance is >= 0.05, at least 10
                lineages survive and no log likelihood was NaN"""


def preamble(args: argparse.Namespace, target: Any, prior: str, kernel: Any) -> None:
    """What is about to run, before it runs."""
    import jax

    from ._kernels import TARGETS

    metric = _metric(args)
    tuned = "step size to its target acceptance" if type(kernel).adjusted else "step size"
    tuned += "" if metric is None else f", {metric} metric from the particles"
    print(f"target   {args.target} (d={target.dim}): {TARGETS[args.target]}")
    print(f"sampler  smc: adaptive tempered SMC, {type(kernel).__name__} x "
          f"{args.mutation_steps} steps per particle and stage ({tuned}, every stage)")  # fmt: skip
    print(f"prior    {prior}; likelihood = target / prior, so log Z is relative to it")
    print(f"run      {args.chains} particles on {jax.device_count()} device(s)", flush=True)


def _stage_of(checkpoint: str | None) -> int | None:
    """The last stage (1-based) saved in `checkpoint`'s SMC file, or None."""
    import samplers

    return samplers.SMC.saved_stages(checkpoint)


def interrupted(args: argparse.Namespace) -> str:
    """The Ctrl-C message: what the checkpoint holds, if there is one."""
    message = "interrupted"
    if args.checkpoint:
        stage = _stage_of(args.checkpoint)
        if stage is None:
            message += "; nothing was saved yet, so a rerun starts afresh"
        else:
            message += f"; the checkpoint holds stage {stage}: rerun with --resume"
    return message


def _modes(target: Any, result: Any) -> tuple[float, float]:
    """The share of the particles in the second mode (nearer `separation e1` than 0) and
    its Monte Carlo standard error."""
    import numpy as np

    separation = float(target.location[0])
    first = result.flat_particles()[:, 0]
    second = (first > separation / 2).astype(np.float64)
    return float(second.mean()), float(result.mcse(second))


def run(args: argparse.Namespace) -> int:
    """Run SMC on `--target`; print the summary, log Z, the verdict; the exit code."""
    import jax
    import numpy as np

    import samplers

    from ._kernels import make_target
    from ._main import EXIT_NOT_CONVERGED

    target = make_target(args.target, args.dim)
    mean, sd, prior, exact = split(args.target, target)

    # The normalising constant on the host, once: log Z is relative to a normalised prior.
    log_norm = float(np.sum(np.log(np.asarray(sd, np.float64)))) + 0.5 * target.dim * math.log(
        2 * math.pi
    )

    def log_prior(x):
        return -0.5 * jax.numpy.sum(((x - mean) / sd) ** 2) - log_norm

    def log_likelihood(x):
        return target(x) - log_prior(x)

    kernel = _kernel(args.mutation_kernel)
    smc = samplers.SMC(kernel, num_mutation_steps=args.mutation_steps, metric=_metric(args))
    k_init, k_run = jax.random.split(jax.random.key(args.seed))
    particles = mean + sd * jax.random.normal(k_init, (args.chains, target.dim))
    preamble(args, target, prior, kernel)
    stage = _stage_of(args.checkpoint) if args.resume else None
    if stage is not None:
        print(f"resuming from the checkpoint after stage {stage}", flush=True)
    tick = time.perf_counter()
    result = smc.run(
        log_prior, log_likelihood, particles, key=k_run, block_size=args.block_size,
        progress=not args.no_progress and sys.stderr.isatty(),
        checkpoint_dir=args.checkpoint, resume=args.resume,
    )  # fmt: skip
    jax.block_until_ready(result.log_likelihood)
    seconds = time.perf_counter() - tick
    verdict = result.verdict
    text = result.summary(print_it=False).splitlines()
    print("\n".join(text[: len(text) - len(verdict.lines())]))  # the verdict follows, in flags
    print(verdict.line)
    for reason in verdict.reasons:
        print(f"  - {reason.problem}: {CLI_FIXES.get(reason.criterion, reason.fix)}")
    z, se = result.log_evidence, result.log_evidence_se
    if exact is None:
        print(f"log Z    {z:.4f} +/- {se:.4f} (se), the data's log marginal likelihood "
              "under the N(0, I) prior (no closed form)")  # fmt: skip
    else:
        away = abs(z - exact) / se if se > 0 else np.inf
        print(f"log Z    {z:.4f} +/- {se:.4f} (se); exact {exact:g} (target and prior both "
              f"normalised): {away:.1f} se away")  # fmt: skip
        if away > FAR:
            # The verdict judges the run's mechanics (ESS, lineages, moves); a region the
            # particles never reached (the funnel's neck) shows only against the exact value.
            print(f"note     log Z is {away:.0f} standard errors from the exact value: the "
                  "particles miss part of the target, which the verdict cannot see; more "
                  "--mutation-steps and --chains may help, a target that no one step size "
                  "fits (the funnel's neck) needs a reparametrisation")  # fmt: skip
    weights = None
    if args.target == "bimodal":
        second, error = _modes(target, result)
        weights = (1 - second, second, error)
        print(f"modes    weights {1 - second:.3f} / {second:.3f} (+/- {error:.3f} mcse) at "
              f"x[0] = 0 / {float(target.location[0]):g}; exact {target.weight:g} / "
              f"{1 - target.weight:g}")  # fmt: skip
    print(f"time     {seconds:.1f} s wall, compilation included")
    from ._report import EXPLAIN_HINT

    print(LEGEND if args.explain else EXPLAIN_HINT)
    if args.out:
        _write_out(args, result, seconds, exact, weights)
    print(f"verdict: {verdict.line}")
    if args.strict and not verdict.converged:
        return EXIT_NOT_CONVERGED
    return 0


def _write_out(args: argparse.Namespace, result: Any, seconds: float, exact: Any,
               weights: Any) -> None:  # fmt: skip
    """`--out DIR/diagnostics.json`: the run's numbers and verdict (no plot: SMC has no
    trace over steps to draw)."""
    import jax
    import numpy as np

    verdict = result.verdict
    data = {
        "sampler": "smc",
        "target": args.target,
        "converged": verdict.converged,
        "verdict": verdict.line,
        "reasons": [
            dict(r._asdict(), value=float(r.value), fix=CLI_FIXES.get(r.criterion, r.fix))
            for r in verdict.reasons
        ],
        "num_particles": result.num_particles,
        "num_stages": result.num_stages,
        "log_evidence": result.log_evidence,
        "log_evidence_se": result.log_evidence_se,
        "exact_log_evidence": exact,
        "temperatures": np.asarray(result.temperatures).tolist(),
        "ess": np.asarray(result.ess).tolist(),
        "acceptance": np.asarray(result.acceptance).tolist(),
        "mode_weights": None if weights is None else list(weights[:2]),
        "mode_weights_mcse": None if weights is None else weights[2],
        "names": list(result.names),
        "devices": jax.device_count(),
        "checkpoint": args.checkpoint,
        "wall_seconds": seconds,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "diagnostics.json"), "w") as f:
        json.dump(data, f, indent=2)
    print(f"wrote {args.out}/diagnostics.json")
