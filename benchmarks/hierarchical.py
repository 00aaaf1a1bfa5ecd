"""samplers.LAPS vs BlackJAX LAPS on a real posterior: eight schools, non-centred.

The posterior of Rubin's eight schools (treatment effects `y` with standard errors
`sigma`), non-centred: `mu ~ N(0, 5)`, `tau ~ HalfCauchy(5)`, `theta_z ~ N(0, 1)^8`,
`y_j ~ N(mu + tau theta_z_j, sigma_j)`, written as a plain JAX log density over the flat
10-vector `(mu, log tau, theta_z[8])` (the Jacobian of `tau = exp(log tau)` included). Both
samplers get that same function; the schedule, early-stop setting and metrics are those of
the `laps` benchmark (see `benchmarks/laps.py`), and `wall_to_b2_s` is the second call's
run time scaled to the gradient count at which b²mean stays below 0.01 (None when it never
does).

The reference moments (`REFERENCE`) come from one long NumPyro NUTS run on the same log
density, computed once with `python -m benchmarks hierarchical --compute-reference` and
stored here: 8 chains x 25,000 draws after 2,000 warm-up steps, `target_accept_prob=0.9`,
seed 0 (NumPyro 0.22, JAX 0.10.2, CPU; 200,000 draws, 1 divergence).
"""

import argparse
import math
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import samplers

from . import laps
from ._common import emit, error_text, have, iid_floor, mesh_for, print_machine, skipped

BENCH = "hierarchical"

Y = (28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0)
SIGMA = (15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0)

# E[x], E[x²], Var[x²] per coordinate of (mu, log_tau, theta_z[8]); see the module docstring.
REFERENCE = {
    "mean": (
        4.39667,
        0.795508,
        0.316006,
        0.0982489,
        -0.0825246,
        0.0597493,
        -0.161023,
        -0.0731386,
        0.358839,
        0.0729016,
    ),
    "second_moment": (
        30.4123,
        2.02457,
        1.07272,
        0.884096,
        0.9524,
        0.898599,
        0.895707,
        0.899493,
        1.05373,
        0.957937,
    ),
    "second_moment_var": (
        1083.25,
        6.83674,
        2.24081,
        1.59124,
        1.81583,
        1.69398,
        1.66739,
        1.64129,
        2.1072,
        1.85865,
    ),
}

COLUMNS = [
    ("impl", "impl", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("early_stop", "early stop", ""),
    ("grads_per_chain", "grads/chain", ".0f"),
    ("compile_s", "compile s", ".1f"),
    ("first_call_s", "first call s", ".1f"),
    ("run_s", "run s", ".2f"),
    ("b2_max", "b²max", ".4f"),
    ("b2_mean", "b²mean", ".4f"),
    ("grads_to_avg", "grads to b²mean<0.01", ".0f"),
    ("wall_to_b2_s", "wall s to b²mean<0.01", ".2f"),
    ("grads_le", "(upper bound)", ""),
    ("load", "load", ".1f"),
]


def logdensity(x: jax.Array) -> jax.Array:
    """Eight schools, non-centred, at the flat position `(mu, log_tau, theta_z[8])`."""
    y, sigma = jnp.asarray(Y), jnp.asarray(SIGMA)
    mu, log_tau, z = x[0], x[1], x[2:]
    tau = jnp.exp(log_tau)
    prior_mu = -0.5 * (mu / 5.0) ** 2 - math.log(5.0 * math.sqrt(2 * math.pi))
    prior_tau = math.log(2 / (math.pi * 5.0)) - jnp.log1p((tau / 5.0) ** 2) + log_tau
    prior_z = -0.5 * jnp.sum(z**2) - 4 * math.log(2 * math.pi)
    resid = (y - mu - tau * z) / sigma
    lik = -0.5 * jnp.sum(resid**2) - jnp.sum(jnp.log(sigma)) - 4 * math.log(2 * math.pi)
    return prior_mu + prior_tau + prior_z + lik


class EightSchools(samplers.targets.Target):
    """The eight-schools posterior as a `samplers` target (its reference from `REFERENCE`)."""

    dim: int = eqx.field(static=True, default=10)
    reference: samplers.targets.Moments | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        return logdensity(x)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="chains (default 512)")
    p.add_argument("--n1", type=int, default=None, help="phase-1 steps (default 500)")
    p.add_argument("--n-adjusted", type=int, default=None, help="adjusted samples (default 33)")
    p.add_argument("--early-stop", action="store_true", help="early stop on both sides")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")
    p.add_argument(
        "--compute-reference",
        action="store_true",
        help="run the long NumPyro NUTS reference and print it (for REFERENCE)",
    )


def compute_reference(num_chains: int = 8, num_samples: int = 25_000, seed: int = 0) -> dict:
    """E[x], E[x²], Var[x²] from a long NumPyro NUTS run on `logdensity`."""
    from numpyro.infer import MCMC, NUTS

    kernel = NUTS(potential_fn=lambda x: -logdensity(x), target_accept_prob=0.9)
    mcmc = MCMC(
        kernel,
        num_warmup=2000,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    init = 0.1 * jax.random.normal(jax.random.key(seed + 1), (num_chains, 10))
    mcmc.run(jax.random.key(seed), init_params=init, extra_fields=("diverging",))
    draws = np.asarray(mcmc.get_samples(), np.float64)
    divergences = int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum())
    return dict(
        mean=draws.mean(0).tolist(),
        second_moment=(draws**2).mean(0).tolist(),
        second_moment_var=(draws**2).var(0).tolist(),
        divergences=divergences,
        draws=int(draws.shape[0]),
    )


def target() -> EightSchools:
    ref = samplers.targets.Moments(
        jnp.asarray(REFERENCE["mean"]),
        jnp.asarray(REFERENCE["second_moment"]),
        jnp.asarray(REFERENCE["second_moment_var"]),
    )
    return EightSchools(reference=ref)


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    records: list[dict] = []
    if args.compute_reference:
        ref = compute_reference()
        print(ref)
        return [emit(dict(benchmark=BENCH, impl="numpyro NUTS reference", **ref), records)]
    if args.smoke:
        s = dict(chains=16, n1=20, n_adjusted=6)
    else:
        s = dict(chains=512, n1=500, n_adjusted=33)
    for key in ("chains", "n1", "n_adjusted"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    t = target()
    floor_max, floor_mean = iid_floor(t.reference, s["chains"])
    common = dict(
        benchmark=BENCH,
        target="eight schools (non-centred)",
        devices=args.num_devices,
        chains=s["chains"],
        n1=s["n1"],
        n_adjusted=s["n_adjusted"],
        early_stop=args.early_stop,
        iid_floor_b2_max=floor_max,
        iid_floor_b2_mean=floor_mean,
    )
    mesh = mesh_for(args.num_devices)
    sides = [("ensemblenn", laps.ours)]
    if not args.skip_peer:
        if have("blackjax"):
            sides.append(
                ("blackjax", lambda *a: laps.run_blackjax(*a, calls=1 if args.smoke else 2))
            )
        else:
            emit(skipped(BENCH, "blackjax", "blackjax"), records)
    for impl, side in sides:
        row = dict(common, impl=impl)
        try:
            row.update(side(t, logdensity, s, args, mesh))
            g = row.get("grads_to_avg")
            if g is not None and not (isinstance(g, float) and math.isnan(g)):
                row["wall_to_b2_s"] = row["run_s"] * g / row["grads_per_chain"]
        except Exception as err:  # noqa: BLE001 - reported as a row
            row.update(status="error", error=error_text(err))
        row["load"] = os.getloadavg()[0]
        emit(row, records)
    return records
