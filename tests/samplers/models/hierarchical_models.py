"""Real hierarchical models with an external reference, for test_hierarchical.py.

The data and the reference numbers are facts kept in `hierarchical_reference.json` (next to
this file), each with its source; the log densities are written here in JAX (no
inference-gym or TensorFlow Probability at test time).

* `StochasticVolatility`: inference-gym's `StochasticVolatilitySP500Small` (100 daily
  S&P500 returns), written non-centred: the sampler moves `(u_phi, mu, u_sigma, z[100])`
  with `phi = 2 sigmoid(u_phi) - 1`, `sigma = softplus(u_sigma)` (inference-gym's own
  bijectors, Jacobians included) and standardised innovations `z` from which the
  log-volatilities follow: `x[0] = mu + sigma / sqrt(1 - phi^2) z[0]`,
  `x[t] = mu + phi (x[t-1] - mu) + sigma z[t]`. `observable` gives what inference-gym's
  ground truth describes (its `identity` transformation): `(phi, mu, sigma, x[0..99])`.
* `EightSchools`: Rubin's eight schools as Stan and NumPyro write it (`mu ~ N(0, 5)`,
  `tau ~ HalfCauchy(5)`, `theta = mu + tau theta_tilde`), non-centred, `log tau`
  unconstrained; `observable` is `(mu, tau, theta[0..7])`, the reference a long NumPyro
  NUTS run (settings in the data file).
* `RadonLike`: inference-gym's `RadonContextualEffectsHalfNormalMinnesota` (centred county
  effects; `county_effect_scale` and `log_radon_scale` HalfNormal(1), log-transformed)
  on simulated data of the Minnesota survey's shape (`radon_like.json`, made by
  `radon_like_reference.py`): the sampler moves `(county_effect_mean, log
  county_effect_scale, county_effect[85], weight[3], log log_radon_scale)`; `observable`
  gives the constrained values in that order, the reference a long NumPyro NUTS run.

Example:
    >>> import jax.numpy as jnp
    >>> from hierarchical_models import EightSchools, RadonLike, StochasticVolatility
    >>> sv, schools, radon = StochasticVolatility(), EightSchools(), RadonLike()
    >>> sv.dim, schools.dim, radon.dim, bool(jnp.isfinite(sv(jnp.zeros(sv.dim))))
    (103, 10, 91, True)
    >>> sv.reference_mean.shape, schools.observable(jnp.zeros(10)).shape
    ((103,), (10,))
"""

import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import samplers

DATA = json.loads((Path(__file__).parent / "hierarchical_reference.json").read_text())
# numpy constants (compile-time constants in every program), as inference-gym computes them:
# the last 100 daily differences of the closing prices, minus their mean.
_PRICES = np.asarray(DATA["stochastic_volatility"]["closing_prices"], np.float64)
RETURNS = (np.diff(_PRICES) - np.diff(_PRICES).mean()).astype(np.float32)
_DAYS = RETURNS.size
_LAG = np.subtract.outer(np.arange(_DAYS), np.arange(_DAYS)).clip(0)  # t - s, or 0
_LOWER = np.tri(_DAYS, dtype=bool)  # s <= t
SCHOOLS_Y = np.asarray(DATA["eight_schools"]["y"], np.float32)
SCHOOLS_SIGMA = np.asarray(DATA["eight_schools"]["sigma"], np.float32)
RADON = json.loads((Path(__file__).parent / "radon_like.json").read_text())["radon_like"]
DATA["radon_like"] = RADON
RADON_COUNTY = np.asarray(RADON["county"])
RADON_FLOOR = np.asarray(RADON["floor"], np.float32)
RADON_FLOOR_BY_COUNTY = (
    np.bincount(RADON_COUNTY, RADON_FLOOR, 85) / np.bincount(RADON_COUNTY, None, 85)
).astype(np.float32)
RADON_URANIUM = np.asarray(RADON["log_uranium_by_county"], np.float32)
RADON_LOG_RADON = np.asarray(RADON["log_radon"], np.float32)


class StochasticVolatility(samplers.targets.Target):
    """inference-gym's StochasticVolatilitySP500Small, non-centred (see the module)."""

    dim: int = eqx.field(static=True, default=103)
    reference: samplers.targets.Moments | None = None

    def _constrained(self, u: Float[Array, " dim"]) -> tuple:
        phi = 2.0 * jax.nn.sigmoid(u[0]) - 1.0
        mu, sigma = u[1], jax.nn.softplus(u[2])
        # The AR(1) recursion unrolled: x[t] - mu = sum_s phi^(t-s) e[s], one matrix-vector
        # product (a scan over 100 days would be 100 sequential steps per gradient).
        shocks = sigma * u[3:]
        shocks = shocks.at[0].divide(jnp.sqrt(1.0 - phi**2))  # the stationary start
        powers = jnp.cumprod(jnp.concatenate([jnp.ones(1), jnp.full(_DAYS - 1, phi)]))
        x = mu + jnp.where(_LOWER, powers[_LAG], 0.0) @ shocks
        return phi, mu, sigma, x

    def __call__(self, u: Float[Array, " dim"]) -> Float[Array, ""]:
        phi, mu, sigma, x = self._constrained(u)
        # (phi + 1) / 2 = s ~ Beta(20, 1.5), s = sigmoid(u0): with the Jacobian ds/du0 =
        # s (1 - s), log p(u0) = 20 log s + 1.5 log(1 - s) (+ const).
        log_prior = -20.0 * jax.nn.softplus(-u[0]) - 1.5 * jax.nn.softplus(u[0])
        log_prior += -jnp.log1p((mu / 5.0) ** 2)  # Cauchy(0, 5)
        # HalfCauchy(0, 2) of sigma = softplus(u2), Jacobian sigmoid(u2).
        log_prior += -jnp.log1p((sigma / 2.0) ** 2) - jax.nn.softplus(-u[2])
        log_prior += -0.5 * jnp.sum(u[3:] ** 2)  # the standardised innovations
        log_likelihood = jnp.sum(-0.5 * x - 0.5 * RETURNS**2 * jnp.exp(-x))
        return log_prior + log_likelihood

    def observable(self, u: Float[Array, " dim"]) -> Float[Array, " dim"]:
        phi, mu, sigma, x = self._constrained(u)
        return jnp.concatenate([jnp.stack([phi, mu, sigma]), x])

    @property
    def reference_mean(self) -> np.ndarray:
        return _flat(DATA["stochastic_volatility"]["reference"], "mean")

    @property
    def reference_sd(self) -> np.ndarray:
        return _flat(DATA["stochastic_volatility"]["reference"], "sd")


class EightSchools(samplers.targets.Target):
    """Eight schools, non-centred (see the module)."""

    dim: int = eqx.field(static=True, default=10)
    reference: samplers.targets.Moments | None = None

    def __call__(self, u: Float[Array, " dim"]) -> Float[Array, ""]:
        y, sigma = SCHOOLS_Y, SCHOOLS_SIGMA
        mu, log_tau, theta_tilde = u[0], u[1], u[2:]
        tau = jnp.exp(log_tau)
        theta = mu + tau * theta_tilde
        log_prior = -0.5 * (mu / 5.0) ** 2 - jnp.log1p((tau / 5.0) ** 2) + log_tau
        log_prior += -0.5 * jnp.sum(theta_tilde**2)
        return log_prior - 0.5 * jnp.sum(((y - theta) / sigma) ** 2)

    def observable(self, u: Float[Array, " dim"]) -> Float[Array, " dim"]:
        tau = jnp.exp(u[1])
        return jnp.concatenate([jnp.stack([u[0], tau]), u[0] + tau * u[2:]])

    @property
    def reference_mean(self) -> np.ndarray:
        return _flat(DATA["eight_schools"]["reference"], "mean")

    @property
    def reference_sd(self) -> np.ndarray:
        return _flat(DATA["eight_schools"]["reference"], "sd")


class RadonLike(samplers.targets.Target):
    """A radon-like hierarchical regression, centred (see the module)."""

    dim: int = eqx.field(static=True, default=91)
    reference: samplers.targets.Moments | None = None

    @staticmethod
    def site_sizes() -> dict[str, int]:
        return {
            "county_effect_mean": 1,
            "county_effect_scale": 1,
            "county_effect": 85,
            "weight": 3,
            "log_radon_scale": 1,
        }

    def _constrained(self, u: Float[Array, " dim"]) -> tuple:
        return u[0], jnp.exp(u[1]), u[2:87], u[87:90], jnp.exp(u[90])

    def __call__(self, u: Float[Array, " dim"]) -> Float[Array, ""]:
        mean, scale, effect, weight, sigma = self._constrained(u)
        # HalfNormal(1) scales on the log scale: the Jacobian adds log scale (= u[1], u[90]).
        log_prior = -0.5 * mean**2 - 0.5 * jnp.sum(weight**2)
        log_prior += -0.5 * scale**2 + u[1] - 0.5 * sigma**2 + u[90]
        log_prior += -0.5 * jnp.sum(((effect - mean) / scale) ** 2) - 85 * u[1]
        county_loc = weight[0] * RADON_URANIUM + weight[2] * RADON_FLOOR_BY_COUNTY + effect
        loc = county_loc[RADON_COUNTY] + weight[1] * RADON_FLOOR
        residual = (RADON_LOG_RADON - loc) / sigma
        log_likelihood = -0.5 * jnp.sum(residual**2) - RADON_COUNTY.size * u[90]
        return log_prior + log_likelihood

    def observable(self, u: Float[Array, " dim"]) -> Float[Array, " dim"]:
        mean, scale, effect, weight, sigma = self._constrained(u)
        return jnp.concatenate([jnp.stack([mean, scale]), effect, weight, sigma[None]])

    @property
    def reference_mean(self) -> np.ndarray:
        return _flat(RADON["reference"], "mean")

    @property
    def reference_sd(self) -> np.ndarray:
        return _flat(RADON["reference"], "sd")


def _flat(reference: dict, key: str) -> np.ndarray:
    """The reference's `key` ("mean" or "sd") of every site, in the observable's order."""
    return np.concatenate([np.atleast_1d(site[key]) for site in reference.values()])
