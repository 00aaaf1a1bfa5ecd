"""A NumPyro user's job end to end: samplers.run vs NumPyro's NUTS on a NumPyro model.

What a user of NumPyro measures when they try the library: a fresh Python process that
imports everything, builds the model, samples it and reads the draws. Both sides sample the
SAME NumPyro model (eight schools, non-centred; a 100-d Bayesian logistic regression on
synthetic data; or the radon-like hierarchical regression of the hierarchical tests, 91-d,
centred, `--models radon_like`): ours through `samplers.targets.from_numpyro` with
`samplers.NUTS()` and `samplers.WindowAdaptation()` (step size and metric tuned, draws
kept), many chains; NumPyro's `MCMC(NUTS(model))` with its warmup, 4 chains over the 4
devices (`chain_method="parallel"`; `--numpyro-chains 128` gives it our chain count,
`"vectorized"`). Each timed process is a child of this one (its whole wall time is measured,
Python's start and the imports included) with JAX's persistent compilation cache either off
(``cold``) or in a folder an earlier, untimed process of the same side filled (``warm``).
The repeats are interleaved (ours cold, ours warm, NumPyro cold, NumPyro warm, then again).
Quality is compared at equal effective sample size: each child reports the minimum bulk ESS
over the model's latent sites (the same function, `samplers.diagnostics.ess`, on both sides'
draws), and ``s per 1000 ESS`` is the wall time divided by it; ``vs numpyro`` divides ours
by NumPyro's with the same cache state.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import cache_for, emit, fills_cache_untimed, have, print_machine, skipped

BENCH = "workflow"
ROOT = Path(__file__).resolve().parent.parent

COLUMNS = [
    ("model", "model", ""),
    ("impl", "impl", ""),
    ("cache", "cache", ""),
    ("draws", "draws (chains x steps)", ""),
    ("wall_s_min", "wall s (min)", ".1f"),
    ("wall_s_median", "(median)", ".1f"),
    ("min_ess", "min ESS", ".0f"),
    ("s_per_kess_min", "s per 1000 ESS (min)", ".2f"),
    ("vs_numpyro_wall", "vs numpyro wall (min)", ".2f"),
    ("vs_numpyro_per_ess", "vs numpyro per ESS (min)", ".2f"),
    ("load_avg_1m", "load", ".1f"),
]

Y = [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]
SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="eight_schools,logistic100",
                   help="comma-separated: eight_schools, logistic100, radon_like")  # fmt: skip
    p.add_argument("--chains", type=int, default=None, help="our chains (default 128)")
    p.add_argument("--warmup", type=int, default=None, help="our warmup steps (default 500)")
    p.add_argument("--steps", type=int, default=None, help="our sampling steps (default 200)")
    p.add_argument("--numpyro-warmup", type=int, default=None, help="NumPyro's (default 1000)")
    p.add_argument("--numpyro-samples", type=int, default=None, help="NumPyro's (1000)")
    p.add_argument("--numpyro-chains", type=int, default=None,
                   help="NumPyro's chains (4; more than the devices: vectorized)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=None, help="timed processes per row (2)")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")
    # Internal: one job in this process (what the parent spawns).
    p.add_argument("--child", choices=("ensemblenn", "numpyro"), help=argparse.SUPPRESS)
    p.add_argument("--model", default="eight_schools", help=argparse.SUPPRESS)


def sizes(args: argparse.Namespace) -> dict:
    smoke = args.smoke
    return dict(
        chains=args.chains or (16 if smoke else 128),
        warmup=args.warmup or (40 if smoke else 500),
        steps=args.steps or (20 if smoke else 200),
        numpyro_warmup=args.numpyro_warmup or (20 if smoke else 1000),
        numpyro_samples=args.numpyro_samples or (20 if smoke else 1000),
        numpyro_chains=args.numpyro_chains or 4,
    )


def problem(name: str):
    """`(model, args, latent sites)`: the NumPyro model both sides sample."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    if name == "eight_schools":

        def eight_schools(sigma, y):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
            with numpyro.plate("school", 8):
                theta_z = numpyro.sample("theta_z", dist.Normal(0.0, 1.0))
                numpyro.sample("obs", dist.Normal(mu + tau * theta_z, sigma), obs=y)

        return eight_schools, (jnp.asarray(SIGMA), jnp.asarray(Y)), ("mu", "tau", "theta_z")
    if name == "logistic100":
        kx, kb, ky = jax.random.split(jax.random.key(42), 3)
        x = jax.random.normal(kx, (1000, 100))
        beta = 0.3 * jax.random.normal(kb, (100,))
        y = jax.random.bernoulli(ky, jax.nn.sigmoid(x @ beta)).astype(jnp.float32)

        def logistic(x, y):
            with numpyro.plate("feature", x.shape[1]):
                b = numpyro.sample("beta", dist.Normal(0.0, 1.0))
            numpyro.sample("obs", dist.Bernoulli(logits=x @ b), obs=y)

        return logistic, (x, y), ("beta",)
    if name == "radon_like":
        return _radon_like()
    raise SystemExit(f"unknown model {name!r}")


def _radon_like():
    """inference-gym's radon model (HalfNormal scales, centred county effects) on the
    simulated survey of the hierarchical tests (`tests/samplers/models/radon_like.json`)."""
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist

    data = json.loads((ROOT / "tests/samplers/models/radon_like.json").read_text())
    data = data["radon_like"]
    county = np.asarray(data["county"])
    floor = np.asarray(data["floor"], np.float32)
    by_county = np.bincount(county, floor, 85) / np.bincount(county, None, 85)
    uranium = np.asarray(data["log_uranium_by_county"], np.float32)
    columns = (county, floor, uranium, by_county.astype(np.float32))

    def radon(county, floor, uranium, floor_by_county, log_radon):
        mean = numpyro.sample("county_effect_mean", dist.Normal(0.0, 1.0))
        scale = numpyro.sample("county_effect_scale", dist.HalfNormal(1.0))
        with numpyro.plate("counties", 85):
            effect = numpyro.sample("county_effect", dist.Normal(mean, scale))
        with numpyro.plate("weights", 3):
            w = numpyro.sample("weight", dist.Normal(0.0, 1.0))
        sigma = numpyro.sample("log_radon_scale", dist.HalfNormal(1.0))
        by = w[0] * uranium + w[2] * floor_by_county + effect
        with numpyro.plate("houses", county.shape[0]):
            numpyro.sample("obs", dist.Normal(by[county] + w[1] * floor, sigma), obs=log_radon)

    args = (*map(jnp.asarray, columns), jnp.asarray(data["log_radon"], jnp.float32))
    sites = ("county_effect_mean", "county_effect_scale", "county_effect", "weight")
    return radon, args, (*sites, "log_radon_scale")


def _min_ess(draws: dict, sites: tuple[str, ...]) -> float:
    """The smallest bulk ESS over the latent sites' coordinates; leaves `(chains, draws, ...)`."""
    import numpy as np

    import samplers

    worst = np.inf
    for site in sites:
        x = np.asarray(draws[site], np.float64)
        x = x.reshape(x.shape[0], x.shape[1], -1)
        worst = min(worst, float(np.min(np.asarray(samplers.diagnostics.ess(x)))))
    return worst


def _child(args: argparse.Namespace) -> None:
    import jax

    s = sizes(args)
    model, data, sites = problem(args.model)
    key = jax.random.key(args.seed)
    if args.child == "ensemblenn":
        import samplers

        target = samplers.targets.from_numpyro(model, *data)
        result = samplers.run(
            samplers.NUTS(), target, key=key, num_chains=s["chains"], num_steps=s["steps"],
            adaptation=samplers.WindowAdaptation(num_steps=s["warmup"]), thin=1,
            progress=False,
        )  # fmt: skip
        draws = {site: result.trace[site] for site in sites}
        shape = f"{s['chains']} x {s['steps']}"
    else:
        from numpyro.infer import MCMC, NUTS

        chains = s["numpyro_chains"]
        method = "parallel" if chains <= jax.local_device_count() else "vectorized"
        mcmc = MCMC(NUTS(model), num_warmup=s["numpyro_warmup"],
                    num_samples=s["numpyro_samples"], num_chains=chains, chain_method=method,
                    progress_bar=False)  # fmt: skip
        mcmc.run(key, *data)
        draws = mcmc.get_samples(group_by_chain=True)
        shape = f"{chains} x {s['numpyro_samples']}"
    jax.block_until_ready(draws)
    print(json.dumps({"child": args.child, "min_ess": _min_ess(draws, sites), "draws": shape}))


def _spawn(args: argparse.Namespace, impl: str, model: str, cache: str | None) -> dict:
    command = [sys.executable, "-m", "benchmarks", BENCH, "--devices", str(args.num_devices),
               "--child", impl, "--model", model, "--seed", str(args.seed),
               "--no-table"]  # fmt: skip
    for flag in (
        "chains",
        "warmup",
        "steps",
        "numpyro_warmup",
        "numpyro_samples",
        "numpyro_chains",
    ):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.smoke:
        command.append("--smoke")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Both sides alike: JAX's own cache options, every program cached; none for "cold"
    # (a folder from the environment, as the test suite sets, would make it warm).
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["ENSEMBLENN_COMPILATION_CACHE"] = "off"
    if cache is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")  # fmt: skip
    tick = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - tick
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} child failed: {proc.stderr.strip().splitlines()[-3:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith('{"child"')][0]
    return dict(json.loads(line), wall=wall)


def run(args: argparse.Namespace) -> list[dict]:
    if args.child:
        _child(args)
        return []
    print_machine(BENCH)
    repeats = args.repeats or (1 if args.smoke else 2)
    impls = ["ensemblenn"]
    records: list[dict] = []
    if have("numpyro") and not args.skip_peer:
        impls.append("numpyro")
    elif not args.skip_peer:
        emit(skipped(BENCH, "numpyro", "numpyro", devices=args.num_devices), records)
    for model in args.models.split(","):
        runs: dict[tuple[str, str], list[dict]] = {
            (i, c): [] for i in impls for c in ("cold", "warm")
        }
        loads: list[float] = []
        with tempfile.TemporaryDirectory() as folder:
            caches = {i: str(Path(folder) / i) for i in impls}
            fill = fills_cache_untimed(args.smoke, repeats)
            for impl in impls if fill else ():
                _spawn(args, impl, model, caches[impl])
            for _ in range(repeats):
                for impl in impls:
                    for cache in ("cold", "warm"):
                        got = _spawn(args, impl, model, cache_for(cache, caches[impl], fill))
                        runs[impl, cache].append(got)
                        loads.append(os.getloadavg()[0])
        rows = {}
        for (impl, cache), got in runs.items():
            walls = [g["wall"] for g in got]
            ess = min(g["min_ess"] for g in got)
            rows[impl, cache] = dict(
                benchmark=BENCH, model=model, impl=impl, cache=cache, draws=got[0]["draws"],
                devices=args.num_devices, repeats=len(got), wall_s_min=min(walls),
                wall_s_median=statistics.median(walls), min_ess=ess,
                s_per_kess_min=1000 * min(walls) / max(ess, 1e-9),
                load_avg_1m=max(loads),
            )  # fmt: skip
        for (_, cache), row in rows.items():
            peer = rows.get(("numpyro", cache))
            if peer is not None:
                row["vs_numpyro_wall"] = row["wall_s_min"] / peer["wall_s_min"]
                row["vs_numpyro_per_ess"] = row["s_per_kess_min"] / peer["s_per_kess_min"]
            emit(row, records)
    return records
