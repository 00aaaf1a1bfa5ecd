"""Builds the radon-like model's data and its NumPyro references (run once, by hand).

    python tests/samplers/models/radon_like_reference.py data       # writes the data
    python tests/samplers/models/radon_like_reference.py reference  # long NumPyro NUTS run
    python tests/samplers/models/radon_like_reference.py baseline   # NumPyro's default NUTS

Each step writes its part of `radon_like.json` (next to this file). The data are
simulated (the Minnesota radon survey itself comes through tensorflow-datasets, which CI
cannot download) with the survey's shape: 85 counties of very unequal sizes (many with one
or two houses), a floor indicator, a county-level log-uranium covariate and the
county-mean floor (the contextual effect), fitted with inference-gym's
`RadonContextualEffectsHalfNormalMinnesota` model, centred. Needs numpyro (not a test
dependency).
"""

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

FILE = Path(__file__).parent / "radon_like.json"
NUM_COUNTIES = 85
TRUTH = {"county_effect_mean": 1.4, "county_effect_scale": 0.3, "weight": [0.7, -0.65, 0.3]}
LOG_RADON_SCALE = 0.75


def make_data() -> dict:
    rng = np.random.default_rng(20261206)
    # geometric sizes: 13 counties of one or two houses, the largest of 29
    sizes = rng.geometric(1 / 10, NUM_COUNTIES)
    county = np.repeat(np.arange(NUM_COUNTIES), sizes)
    uranium_by_county = rng.normal(0.0, 0.35, NUM_COUNTIES)
    floor = (rng.uniform(size=county.size) < 0.16).astype(np.int64)
    floor_by_county = np.bincount(county, floor, NUM_COUNTIES) / sizes
    effect = rng.normal(TRUTH["county_effect_mean"], TRUTH["county_effect_scale"], NUM_COUNTIES)
    w = TRUTH["weight"]
    loc = (
        w[0] * uranium_by_county[county]
        + w[1] * floor
        + w[2] * floor_by_county[county]
        + effect[county]
    )
    log_radon = loc + LOG_RADON_SCALE * rng.normal(size=county.size)
    return {
        "source": (
            "Simulated (numpy default_rng(20261206), tests/samplers/models/"
            "radon_like_reference.py) with the Minnesota radon survey's shape; model: "
            "inference-gym 0.0.5's RadonContextualEffectsHalfNormalMinnesota (centred "
            "county effects, HalfNormal(1) scales, Normal(0, 1) weights and mean)."
        ),
        "truth": {**TRUTH, "log_radon_scale": LOG_RADON_SCALE},
        "county": county.tolist(),
        "floor": floor.tolist(),
        "log_uranium_by_county": np.round(uranium_by_county, 6).tolist(),
        "log_radon": np.round(log_radon, 6).tolist(),
    }


def _numpyro_run(seed, num_chains, num_warmup, num_samples, target, chain_method):
    import jax
    from hierarchical_models import RadonLike
    from numpyro.infer import MCMC, NUTS

    model = RadonLike()
    kernel = NUTS(potential_fn=lambda u: -model(u), target_accept_prob=target)
    mcmc = MCMC(
        kernel,
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        progress_bar=False,
    )
    init = 0.5 * jax.random.normal(jax.random.key(seed + 100), (num_chains, model.dim))
    start = time.perf_counter()
    mcmc.run(jax.random.key(seed), init_params=init, extra_fields=("diverging", "accept_prob"))
    draws = mcmc.get_samples(group_by_chain=True)
    jax.block_until_ready(draws)
    wall = time.perf_counter() - start
    observed = jax.vmap(jax.vmap(model.observable))(draws)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    step = mcmc.last_state.adapt_state.step_size
    return model, observed, extra, np.ravel(np.asarray(step)), wall


def main(step: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    data = {"radon_like": {}} if step == "data" else json.loads(FILE.read_text())
    if step == "data":
        data["radon_like"] = make_data()
    elif step == "reference":
        from numpyro.diagnostics import split_gelman_rubin

        model, obs, extra, _, wall = _numpyro_run(7, 8, 2000, 25_000, 0.95, "vectorized")
        obs = np.asarray(obs, np.float64)
        flat = obs.reshape(-1, obs.shape[-1])
        names = model.site_sizes()
        mean, sd, start = flat.mean(0), flat.std(0), 0
        reference = {}
        for name, size in names.items():
            part = slice(start, start + size)
            reference[name] = {"mean": mean[part].tolist(), "sd": sd[part].tolist()}
            start += size
        rhat = float(np.max(split_gelman_rubin(obs)))
        divergences = int(np.sum(extra["diverging"]))
        data["radon_like"]["reference"] = reference
        data["radon_like"]["reference_source"] = (
            "NumPyro 0.22.0 NUTS (potential_fn = minus hierarchical_models.RadonLike's log "
            "density), 8 chains, 2000 warmup + 25000 draws each, target_accept_prob=0.95, "
            "chain_method='vectorized', jax.random.key(7), starts 0.5 * N(0, 1) in the "
            f"unconstrained space: {divergences} divergences in 200000 draws, max R-hat "
            f"{rhat:.5f} ({wall:.0f} s)."
        )
    elif step == "baseline":
        runs = []
        for seed in range(4):
            _, _, extra, steps, wall = _numpyro_run(seed, 4, 1000, 2000, 0.8, "sequential")
            runs.append(
                {
                    "seed": seed,
                    "divergences": int(np.sum(extra["diverging"])),
                    "transitions": 8000,
                    "final_step_sizes": np.round(steps.astype(np.float64), 3).tolist(),
                    "mean_accept_prob": round(float(np.mean(extra["accept_prob"])), 3),
                    "wall_s": round(wall, 1),
                }
            )
            print(runs[-1], flush=True)
        total = sum(r["divergences"] for r in runs)
        data["radon_like"]["numpyro_nuts"] = {
            "settings": (
                "NumPyro 0.22.0 NUTS (potential_fn as above, default target_accept_prob=0.8, "
                "diagonal mass matrix), 4 chains, 1000 warmup + 2000 draws, "
                "chain_method='sequential', jax.random.key(seed), starts 0.5 * N(0, 1) "
                "(jax.random.key(seed + 100)), CPU (2 cores), wall_s includes compilation"
            ),
            "runs": runs,
            "divergence_rate": total / (8000 * len(runs)),
        }
    text = json.dumps(data, indent=1)
    # one line per list of numbers, not one per number
    text = re.sub(r"\[[-0-9.e,\s]+\]", lambda m: " ".join(m.group(0).split()), text)
    FILE.write_text(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
