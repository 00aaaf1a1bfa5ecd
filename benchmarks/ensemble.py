"""samplers.Stretch vs emcee (`vectorize=True`) and NumPyro AIES (stretch move).

All three run the affine-invariant stretch move (Goodman & Weare, a = 2) with the same
walkers, started from the same exact draws of the target (so the autocorrelation time
measures stationary mixing, not burn-in), for the same number of steps:

* ours: `samplers.run(samplers.Stretch(a=2.0), ..., thin=10, chunk_size=steps)`;
* emcee: `emcee.EnsembleSampler(walkers, dim, log_prob, vectorize=True)` with a NumPy
  log density (its usual use), `run_mcmc(..., thin_by=10)`;
* NumPyro: `MCMC(AIES(potential_fn=..., moves={AIES.StretchMove(): 1.0}), num_warmup=0,
  chain_method="vectorized", thinning=10)`.

Timing: the JAX implementations are called once to compile (`compile_s`, from JAX's
compile events), then `--repeats` times each, interleaved (ours, AIES, ours, ...) so a load
change on a shared machine hits both alike; `run_s` is the fastest run's wall time minus any
compilation it repeated (NumPyro's `MCMC.run` compiles again on every call), and the
`_median` fields the median run. Throughput is walker-steps per second (from the fastest
run; `vs AIES (median)` compares medians). The 1-minute load average is in every row.

Autocorrelation: the integrated autocorrelation time `tau` (in steps, worst coordinate)
comes from `emcee.autocorr.integrated_time` (mean autocorrelation over the walkers, Sokal's
window with c = 5) on the thinned chain, times the thinning (10, or more to keep at most
15,000 stored draws); ESS = walkers * steps / tau. emcee's criterion for a reliable estimate
is a chain longer than 50 tau (`reliable` in the JSON line). On the 20-d Gaussian tau is
about 270 steps, so the default 15,000 steps (55 tau) are enough. On the 36-d Rosenbrock
the stretch move mixes very slowly: 400,000 steps (`--steps 15000,400000 --targets
rosenbrock36`) give tau ~ 30,000 steps for all three implementations, still only 13 tau,
so tau is at least that; a reliable estimate needs ~1.5 million steps, which `--full` runs.
The default 40,000 steps (~1.3 tau) measure throughput only: their tau (~4,000) is a gross
underestimate, and so is every ESS derived from it (flagged `reliable=False`).

Goal: ours >= 2x AIES walker-steps/s.
"""

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import samplers

from ._common import clock, emit, error_text, have, mesh_for, print_machine, skipped

BENCH = "ensemble"
MAX_DRAWS = 15_000  # stored draws per walker: thin = max(10, steps // MAX_DRAWS)

COLUMNS = [
    ("target", "target", ""),
    ("impl", "impl", ""),
    ("devices", "dev", "d"),
    ("walkers", "walkers", "d"),
    ("steps", "steps", "d"),
    ("compile_s", "compile s", ".2f"),
    ("run_s", "run s", ".2f"),
    ("walker_steps_per_s", "walker-steps/s", ".3g"),
    ("speedup_vs_aies", "vs AIES (min)", ".2f"),
    ("speedup_vs_aies_median", "vs AIES (median)", ".2f"),
    ("tau_max", "tau (max)", ".0f"),
    ("steps_over_tau", "steps/tau", ".0f"),
    ("ess_per_s", "ESS/s (worst coord.)", ".3g"),
    ("acceptance", "acceptance", ".3f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--walkers", type=int, default=None, help="default 256")
    p.add_argument(
        "--steps",
        default=None,
        help="steps for gauss20,rosenbrock36 (default 15000,40000; --full 15000,1500000)",
    )
    p.add_argument("--targets", default="gauss20,rosenbrock36")
    p.add_argument("--repeats", type=int, default=None, help="timed runs each (default 3)")


def _targets(smoke: bool) -> dict[str, tuple[Any, Any]]:
    """name -> (JAX target module, NumPy vectorized log density)."""
    dim = 4 if smoke else 20
    gauss = samplers.targets.IllConditionedGaussian(dim=dim, condition_number=100.0)
    variances = np.asarray(gauss.variances, float)
    pairs, q = (2 if smoke else 18), 0.1
    rosen = samplers.targets.Rosenbrock(num_pairs=pairs, Q=q)

    def gauss_np(x: np.ndarray) -> np.ndarray:
        return -0.5 * np.sum(x * x / variances, axis=1)

    def rosen_np(x: np.ndarray) -> np.ndarray:
        a, b = x[:, :pairs], x[:, pairs:]
        return -0.5 * np.sum((a - 1.0) ** 2, axis=1) - 0.5 * np.sum((b - a * a) ** 2 / q, axis=1)

    return {f"gauss{dim}": (gauss, gauss_np), f"rosenbrock{2 * pairs}": (rosen, rosen_np)}


def thin_for(steps: int) -> int:
    return max(10, steps // MAX_DRAWS)


def _tau(chain: np.ndarray, thin: int) -> np.ndarray:
    """Integrated autocorrelation time (in steps) per coordinate; chain (draws, walkers, d)
    thinned by `thin`."""
    import emcee.autocorr  # a pure-NumPy module; without emcee use our fallback

    return emcee.autocorr.integrated_time(chain, quiet=True) * thin


def _tau_fallback(chain: np.ndarray, thin: int) -> np.ndarray:
    """The same estimator as emcee's (mean autocorrelation over walkers, Sokal's automatic
    window with c = 5), for when emcee is not installed."""
    n = chain.shape[0]
    x = chain - chain.mean(axis=0)
    f = np.fft.rfft(x, n=2 * n, axis=0)
    acf = np.fft.irfft(f * np.conj(f), axis=0)[:n]
    acf = acf / acf[:1]
    rho = acf.mean(axis=1)  # (lags, d)
    taus = 2.0 * np.cumsum(rho, axis=0) - 1.0
    out = []
    for j in range(rho.shape[1]):
        window = np.arange(n) < 5.0 * taus[:, j]
        m = int(np.argmin(window)) if not window.all() else n - 1
        out.append(taus[m, j])
    return np.asarray(out) * thin


def _metrics(chain: np.ndarray, walkers: int, steps: int, run_s: float, thin: int) -> dict:
    tau = _tau(chain, thin) if have("emcee") else _tau_fallback(chain, thin)
    tau_max = float(np.max(tau))
    ess = walkers * steps / tau_max
    return dict(
        tau_max=tau_max,
        tau_mean=float(np.mean(tau)),
        steps_over_tau=steps / tau_max,
        reliable=bool(steps >= 50 * tau_max),
        ess=ess,
        ess_per_s=ess / run_s,
        walker_steps_per_s=walkers * steps / run_s,
    )


def _ours(target: Any, x0: np.ndarray, steps: int, thin: int, seed: int, mesh: Any) -> Any:
    """A call of our sampler (for `_timed`) and how to read its result."""
    positions = jnp.asarray(x0, jnp.float32)

    def call() -> Any:
        return jax.block_until_ready(
            samplers.run(
                samplers.Stretch(a=2.0),
                target,
                positions,
                key=jax.random.key(seed),
                num_steps=steps,
                thin=thin,
                chunk_size=steps,
                mesh=mesh,
                progress=False,
            )
        )

    def read(result: Any) -> tuple[np.ndarray, float]:
        chain = np.asarray(result.trace).transpose(1, 0, 2)  # (draws, walkers, d)
        return chain, float(np.mean(result.acceptance_rate))

    return call, read


def _aies(target: Any, x0: np.ndarray, steps: int, thin: int, seed: int) -> Any:
    from numpyro.infer import AIES, MCMC

    walkers = x0.shape[0]
    kernel = AIES(potential_fn=lambda z: -target(z), moves={AIES.StretchMove(a=2.0): 1.0})
    mcmc = MCMC(
        kernel,
        num_warmup=0,
        num_samples=steps,
        num_chains=walkers,
        chain_method="vectorized",
        thinning=thin,
        progress_bar=False,
    )
    init = jnp.asarray(x0, jnp.float32)

    def call() -> Any:
        mcmc.run(jax.random.key(seed), init_params=init)
        return jax.block_until_ready(mcmc.get_samples(group_by_chain=True))

    def read(samples: Any) -> tuple[np.ndarray, float]:
        chain = np.asarray(samples).transpose(1, 0, 2)
        return chain, float(mcmc.last_state.inner_state.mean_accept_prob)

    return call, read


def _timed(calls: dict, repeats: int) -> dict:
    """Each call's first run (compilation) and then `repeats` runs, interleaved across
    the implementations, so that a load change on this shared machine hits them alike.
    `run_s` is a run's wall time minus any compilation it repeated (NumPyro's `MCMC.run`
    compiles again on every call); min and median over the repeats."""
    out: dict = {}
    for name, (call, _) in calls.items():
        with clock() as first:
            call()
        out[name] = dict(compile_s=first.compile_s, first_call_s=first.wall, times=[])
    for _ in range(repeats):
        for name, (call, _) in calls.items():
            with clock() as c:
                result = call()
            out[name]["times"].append(c.run_s)
            out[name]["recompiles"] = c.compiles
            out[name]["result"] = result
    for name, (_, read) in calls.items():
        row = out[name]
        times = sorted(row.pop("times"))
        row.update(run_s=times[0], run_s_median=times[len(times) // 2])
        row["chain"], row["acceptance"] = read(row.pop("result"))
    return out


def _emcee(log_prob: Any, x0: np.ndarray, steps: int, thin: int, seed: int) -> dict:
    import emcee

    walkers, dim = x0.shape
    sampler = emcee.EnsembleSampler(walkers, dim, log_prob, vectorize=True)
    sampler.random_state = np.random.RandomState(seed).get_state()
    t0 = time.perf_counter()
    # emcee's thin_by makes `nsteps * thin_by` proposals and stores `nsteps` draws.
    sampler.run_mcmc(np.asarray(x0, float), steps // thin, thin_by=thin, progress=False)
    run_s = time.perf_counter() - t0
    chain = sampler.get_chain()  # (draws, walkers, d)
    row = dict(compile_s=0.0, run_s=run_s, acceptance=float(np.mean(sampler.acceptance_fraction)))
    row.update(_metrics(chain, walkers, steps, run_s, thin))
    return row


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    walkers = args.walkers or (16 if args.smoke else 256)
    if args.smoke:
        default_steps = [200, 200]
    elif args.full:
        default_steps = [15_000, 1_500_000]
    else:
        default_steps = [15_000, 40_000]
    steps_list = [int(s) for s in args.steps.split(",")] if args.steps else default_steps
    n = args.num_devices
    mesh = mesh_for(n)
    records: list[dict] = []
    chosen = args.targets.split(",")
    all_targets = _targets(args.smoke)
    for (name, (target, log_prob)), steps in zip(all_targets.items(), steps_list):
        if not any(name.startswith(c.rstrip("0123456789")) for c in chosen):
            continue
        x0 = np.asarray(
            jax.vmap(target.sample)(jax.random.split(jax.random.key(args.seed), walkers)),
            np.float64,
        )
        common = dict(
            benchmark=BENCH,
            target=name,
            devices=n,
            walkers=walkers,
            steps=steps,
            thin=thin_for(steps),
        )
        thin = thin_for(steps)
        rows = {}
        calls = {"ensemblenn": _ours(target, x0, steps, thin, args.seed, mesh)}
        if have("numpyro"):
            calls["numpyro AIES"] = _aies(target, x0, steps, thin, args.seed)
        else:
            rows["numpyro AIES"] = skipped(
                BENCH,
                "numpyro AIES",
                "numpyro",
                **{k: v for k, v in common.items() if k != "benchmark"},
            )
        try:
            timed = _timed(calls, args.repeats or (1 if args.smoke else 3))
        except Exception as err:  # noqa: BLE001 - reported as a row
            timed = {}
            for impl in calls:
                rows[impl] = dict(common, impl=impl, status="error", error=error_text(err))
        for impl, t in timed.items():
            chain = t.pop("chain")
            row = dict(common, impl=impl, **t)
            row.update(_metrics(chain, walkers, steps, t["run_s"], thin))
            row["walker_steps_per_s_median"] = walkers * steps / t["run_s_median"]
            rows[impl] = row
        if have("emcee"):
            row = dict(common, impl="emcee")
            try:
                row.update(_emcee(log_prob, x0, steps, thin, args.seed))
            except Exception as err:  # noqa: BLE001 - reported as a row
                row.update(status="error", error=error_text(err))
            rows["emcee"] = row
        else:
            rows["emcee"] = skipped(
                BENCH, "emcee", "emcee", **{k: v for k, v in common.items() if k != "benchmark"}
            )
        base = rows.get("numpyro AIES", {}).get("walker_steps_per_s")
        base_median = rows.get("numpyro AIES", {}).get("walker_steps_per_s_median")
        for row in rows.values():
            if base and row.get("walker_steps_per_s"):
                row["speedup_vs_aies"] = row["walker_steps_per_s"] / base
            if base_median and row.get("walker_steps_per_s_median"):
                row["speedup_vs_aies_median"] = row["walker_steps_per_s_median"] / base_median
            emit(row, records)
    return records
