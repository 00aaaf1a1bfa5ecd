"""samplers.LAPS vs BlackJAX LAPS on an ill-conditioned Gaussian and a logistic regression.

Both samplers run the same schedule in the same process: `n1` unadjusted (phase-1) steps,
then `n_adjusted` Metropolis-adjusted MCLMC samples of which the first half tune the step
size (BlackJAX: `num_steps2 = n_adjusted * 15 steps * 2 grads`, `num_adaptation_samples =
n_adjusted // 2`; ours: `LAPS(num_steps1=n1, num_adaptation_steps=n_adjusted // 2)` then
`n_adjusted - n_adjusted // 2` sampling steps). Early stopping is off on both sides by
default (`--early-stop` turns it on for both, BlackJAX with `observables_for_bias=x**2`).

Each configuration is called twice: the first call's compilation (tracing, lowering and XLA,
summed from JAX's compile events) is `compile_s`; `run_s` is the second call's wall time
minus any compilation it did again (BlackJAX recompiles on every call: its closures are new
objects each time).

Metrics: gradient evaluations per chain; grads/s over all chains; final per-step ensemble
b² (max, mean over coordinates of `(Ê[x²] - E[x²])² / Var[x²]`, Ê the mean over chains at
the last step); and the gradient evaluations per chain after which the per-step ensemble
b²_mean stays below 0.01 and b²_max below 0.05. BlackJAX records b² at every phase-1 and
phase-2 step. samplers.LAPS reports no b² during its adaptation, so for ours the trajectory
starts at the first sampling step and the figure is an upper bound (`grads_le`).

The BlackJAX Explicit-mesh row (``jax.make_mesh``'s default axis type) is expected to fail
with NotImplementedError after phase 1; it is reported with its error.
"""

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import samplers

from ._common import (
    clock,
    closed_over_logdensity,
    emit,
    error_text,
    gaussian,
    grads_to_stay_below,
    have,
    iid_floor,
    logistic,
    mesh_for,
    print_machine,
    skipped,
)

BENCH = "laps"
AVG, MAX = 0.01, 0.05

COLUMNS = [
    ("target", "target", ""),
    ("impl", "impl", ""),
    ("mesh", "mesh", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("grads_per_chain", "grads/chain", ".0f"),
    ("compile_s", "compile s", ".1f"),
    ("run_s", "run s", ".2f"),
    ("grads_per_s", "grads/s", ".3g"),
    ("b2_max", "b²max", ".4f"),
    ("b2_mean", "b²mean", ".4f"),
    ("grads_to_avg", "grads to b²mean<0.01", ".0f"),
    ("grads_to_max", "grads to b²max<0.05", ".0f"),
    ("grads_le", "(upper bound)", ""),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="chains (default 512)")
    p.add_argument("--n1", type=int, default=None, help="phase-1 steps (default 500)")
    p.add_argument(
        "--n-adjusted",
        type=int,
        default=None,
        help="adjusted samples incl. step-size tuning (default 33)",
    )
    p.add_argument(
        "--targets",
        default=None,
        help="comma-separated: gauss100,logreg50 (default both; --smoke: gauss100)",
    )
    p.add_argument("--early-stop", action="store_true", help="early stop on both sides")
    p.add_argument(
        "--no-explicit",
        action="store_true",
        help="skip the Explicit-mesh rows (--smoke skips them unless --explicit)",
    )
    p.add_argument("--explicit", action="store_true", help="Explicit rows even with --smoke")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")


def sizes(args: argparse.Namespace) -> dict:
    if args.smoke:
        base = dict(chains=16, n1=20, n_adjusted=6, dim=6, data=100, features=4, draws=20_000)
    elif args.full:
        base = dict(
            chains=4096, n1=500, n_adjusted=33, dim=100, data=1000, features=50, draws=1_000_000
        )
    else:
        base = dict(
            chains=512, n1=500, n_adjusted=33, dim=100, data=1000, features=50, draws=200_000
        )
    for key in ("chains", "n1", "n_adjusted"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    return base


def targets(args: argparse.Namespace, s: dict) -> dict[str, Any]:
    out = {}
    names = args.targets or ("gauss100" if args.smoke else "gauss100,logreg50")
    for name in names.split(","):
        name = name.strip()
        if name == "gauss100":
            out[name] = gaussian(s["dim"], 100.0)
        elif name == "logreg50":
            out[name] = logistic(s["data"], s["features"], s["draws"])
        else:
            raise SystemExit(f"unknown target {name!r} (gauss100, logreg50)")
    return out


def run_ours(target: Any, logdensity: Any, s: dict, args: argparse.Namespace, mesh: Any) -> Any:
    """One `samplers.run` with LAPS: half the adjusted steps tune, half sample."""
    n_adapt = s["n_adjusted"] // 2
    laps = samplers.LAPS(
        num_steps1=s["n1"], num_adaptation_steps=n_adapt, early_stop=args.early_stop
    )
    positions = jax.random.normal(jax.random.key(args.seed), (s["chains"], target.dim))
    n_samples = s["n_adjusted"] - n_adapt
    result = samplers.run(
        None,
        logdensity,
        positions,
        key=jax.random.key(args.seed + 1),
        num_steps=n_samples,
        adaptation=laps,
        mesh=mesh,
        reference=target.reference,
        track_bias=True,
        chunk_size=n_samples,
        progress=False,
    )
    return jax.block_until_ready(result)


def ours(target: Any, logdensity: Any, s: dict, args: argparse.Namespace, mesh: Any) -> dict:
    n_samples = s["n_adjusted"] - s["n_adjusted"] // 2
    with clock() as first:
        run_ours(target, logdensity, s, args, mesh)
    with clock() as second:
        result = run_ours(target, logdensity, s, args, mesh)
    info = result.adaptation_info
    adapt_grads = float(info.num_grads)
    sample_grads = np.asarray(result.num_grads, float).mean()
    per_step = sample_grads / n_samples
    bias = np.asarray(result.bias_history)  # (steps, 2): max, mean
    grads = adapt_grads + per_step * np.arange(1, n_samples + 1)
    total = adapt_grads + sample_grads
    return dict(
        grads_per_chain=total,
        compile_s=first.compile_s,
        first_call_s=first.wall,
        second_call_s=second.wall,
        run_s=second.run_s,
        recompiles=second.compiles,
        compile_events_first=first.compiles,
        grads_per_s=total * s["chains"] / max(second.run_s, 1e-9),
        b2_max=float(bias[-1, 0]),
        b2_mean=float(bias[-1, 1]),
        b2_all_draws_max=float(result.diagnostics.bias_squared_max),
        b2_all_draws_mean=float(result.diagnostics.bias_squared_mean),
        grads_to_avg=grads_to_stay_below(grads, bias[:, 1], AVG),
        grads_to_max=grads_to_stay_below(grads, bias[:, 0], MAX),
        grads_le="yes",
        phase1_steps=int(info.num_steps1),
        adaptation_grads=adapt_grads,
        step_size=float(info.step_size),
        integration_steps=int(info.num_integration_steps),
        acceptance=float(np.mean(result.acceptance_rate)),
    )


def run_blackjax(
    target: Any, logdensity: Any, s: dict, args: argparse.Namespace, mesh: Any, calls: int = 2
) -> dict:
    from blackjax.adaptation.laps import laps

    dim = target.dim
    e_x2 = np.asarray(target.reference.second_moment)
    var_x2 = np.asarray(target.reference.second_moment_var)
    steps_per_sample = 15

    def contract(estimate: Any) -> Any:  # the laps.bias(model) contract: [max, mean] b²
        b2 = (estimate - e_x2) ** 2 / var_x2
        return jnp.array([jnp.max(b2), jnp.mean(b2)])

    def call(key: Any) -> tuple:
        out = laps(
            logdensity,
            lambda k: jax.random.normal(k, (dim,)),
            dim,
            s["n1"],
            s["n_adjusted"] * steps_per_sample * 2,
            s["chains"],
            mesh,
            key,
            early_stop=args.early_stop,
            observables_for_bias=lambda x: x**2,
            contract=contract,
            steps_per_sample=steps_per_sample,
        )
        return jax.block_until_ready(out)

    clocks = []
    for _ in range(calls):
        with clock() as c:
            info, grads_per_step, _, state = call(jax.random.key(args.seed + 1))
        clocks.append(c)
    b1 = np.asarray(info["phase_1"]["bias"])
    b2 = np.asarray(info["phase_2"]["bias"])
    n1 = b1.shape[0]
    per_sample = grads_per_step * steps_per_sample
    grads = np.concatenate(
        [1 + np.arange(1, n1 + 1), 1 + n1 + per_sample * np.arange(1, b2.shape[0] + 1)]
    )
    bias = np.concatenate([b1, b2])
    total = float(grads[-1])
    first, last = clocks[0], clocks[-1]
    return dict(
        grads_per_chain=total,
        compile_s=first.compile_s,
        first_call_s=first.wall,
        second_call_s=last.wall,
        run_s=last.run_s,
        recompiles=last.compiles,
        compile_events_first=first.compiles,
        grads_per_s=total * s["chains"] / max(last.run_s, 1e-9),
        b2_max=float(bias[-1, 0]),
        b2_mean=float(bias[-1, 1]),
        grads_to_avg=grads_to_stay_below(grads, bias[:, 1], AVG),
        grads_to_max=grads_to_stay_below(grads, bias[:, 0], MAX),
        grads_le="no",
        phase1_steps=int(n1),
        step_size=float(np.asarray(info["phase_2"]["step_size"])[-1]),
        acceptance=float(np.asarray(info["phase_2"]["acc_prob"])[-1]),
    )


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    s = sizes(args)
    n = args.num_devices
    records: list[dict] = []
    peer = have("blackjax") and not args.skip_peer
    for name, target in targets(args, s).items():
        logdensity = closed_over_logdensity(target)
        floor_max, floor_mean = iid_floor(target.reference, s["chains"])
        common = dict(
            benchmark=BENCH,
            target=name,
            devices=n,
            chains=s["chains"],
            n1=s["n1"],
            n_adjusted=s["n_adjusted"],
            early_stop=args.early_stop,
            iid_floor_b2_max=floor_max,
            iid_floor_b2_mean=floor_mean,
        )
        explicit_rows = not args.no_explicit and (args.explicit or not args.smoke)
        meshes = [("auto", False)] + ([("explicit", True)] if explicit_rows else [])
        for mesh_name, explicit in meshes:
            mesh = mesh_for(n, explicit)
            row = dict(common, impl="ensemblenn", mesh=mesh_name)
            if explicit and name != "gauss100":
                continue  # one Explicit row per device count is enough to show it works
            try:
                if explicit:
                    row.update(_ours_once(target, logdensity, s, args, mesh))
                else:
                    row.update(ours(target, logdensity, s, args, mesh))
            except Exception as err:  # noqa: BLE001 - reported as a row
                row.update(status="error", error=error_text(err))
            emit(row, records)
            if not peer:
                if not args.skip_peer:
                    emit(
                        skipped(
                            BENCH,
                            "blackjax",
                            "blackjax",
                            **{k: v for k, v in common.items() if k != "benchmark"},
                            mesh=mesh_name,
                        ),
                        records,
                    )
                continue
            row = dict(common, impl="blackjax", mesh=mesh_name)
            try:
                if explicit:
                    with clock() as c:
                        run_blackjax(target, logdensity, s, args, mesh, calls=1)
                    row.update(first_call_s=c.wall, note="ran (unexpected)")
                else:
                    # --smoke: one call (compile_s then includes the run; saves a compile)
                    row.update(
                        run_blackjax(
                            target, logdensity, s, args, mesh, calls=1 if args.smoke else 2
                        )
                    )
            except Exception as err:  # noqa: BLE001 - the Explicit crash is the result
                row.update(
                    status="error",
                    error=error_text(err),
                    expected_error=explicit,
                    seconds_to_failure=round(c.wall, 2) if explicit else None,
                )
            emit(row, records)
    return records


def _ours_once(target: Any, logdensity: Any, s: dict, args: argparse.Namespace, mesh: Any) -> dict:
    """Ours on an Explicit mesh: one call (it works; its numbers equal the Auto row's)."""
    with clock() as c:
        result = run_ours(target, logdensity, s, args, mesh)
    bias = np.asarray(result.bias_history)
    total = float(result.adaptation_info.num_grads) + float(np.mean(result.num_grads))
    return dict(
        grads_per_chain=total,
        first_call_s=c.wall,
        compile_s=c.compile_s,
        b2_max=float(bias[-1, 0]),
        b2_mean=float(bias[-1, 1]),
        note="one call; works on Explicit meshes",
    )
