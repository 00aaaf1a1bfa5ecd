"""Tuning the mutation kernel at every stage from the particle population.

The metric is the particles' variance (diagonal) or covariance (dense) after resampling,
computed with the device-count invariant collectives; the step size is moved on the host
towards the target acceptance from the previous stage's mean acceptance (one
multiplicative update per stage: `eps * exp(GAIN * (acceptance - target))`).
"""

import dataclasses
import math
from typing import Literal

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

import ensemblenn as enn

from .._errors import SamplerError
from ..kernels import RandomWalk, Sampler, resolve

GAIN = 1.0  # log step size per unit of acceptance error: x0.45 at 0 acceptance (target 0.8)
STEP_SIZE_BOUNDS = (1e-6, 1e3)  # relative to the population's scale (the metric)

Metric = Literal["diagonal", "dense"] | None


def has_field(kernel: Sampler, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(kernel))


def metric_mode(kernel: Sampler, metric: Metric) -> str | None:
    """Where the population's metric goes: `"imm"` (an `inverse_mass_matrix` field),
    `"step"` (a random walk's per-coordinate scale) or None (left as it is)."""
    if metric is None:
        return None
    if has_field(kernel, "inverse_mass_matrix"):
        return "imm"
    if isinstance(kernel, RandomWalk) and metric == "diagonal":
        return "step"
    return None


def check_metric(kernel: Sampler, metric: Metric) -> None:
    """A dense metric needs a kernel whose `inverse_mass_matrix` takes a matrix."""
    if metric != "dense" or not has_field(kernel, "inverse_mass_matrix"):
        return
    field = next(f for f in dataclasses.fields(kernel) if f.name == "inverse_mass_matrix")
    if field.metadata.get("shape", "vector") != "metric":
        name = type(kernel).__name__
        raise SamplerError(
            f"SMC(metric='dense'): {name}.inverse_mass_matrix takes a vector (diagonal) "
            "only, not a matrix.\n  fix: metric='diagonal', or a kernel with a dense metric "
            "(samplers.HMC, MALA, NUTS)."
        )


def tunes_step_size(kernel: Sampler) -> bool:
    """Whether the step size is tuned to an acceptance: a Metropolis-adjusted kernel with a
    `step_size` field (an unadjusted kernel accepts every move by construction)."""
    return has_field(kernel, "step_size") and type(kernel).adjusted


def initial_step_size(kernel: Sampler) -> float:
    """The kernel's own step size (geometric mean of an array), or 1 without one."""
    if not has_field(kernel, "step_size") or kernel.step_size is None:
        return 1.0
    value = np.asarray(resolve(kernel.step_size, 0), np.float64)
    value = value[np.isfinite(value) & (value > 0)]
    return float(np.exp(np.mean(np.log(value)))) if value.size else 1.0


def next_step_size(step_size: float, acceptance: float, target: float) -> float:
    """One stage's update of the step size towards the target acceptance.

    Example:
        >>> from samplers.smc._tuning import next_step_size
        >>> next_step_size(1.0, 0.8, 0.8), next_step_size(1.0, 0.3, 0.8) < 1.0
        (1.0, True)
    """
    if not math.isfinite(acceptance):
        acceptance = 0.0
    new = step_size * math.exp(GAIN * (acceptance - target))
    return min(max(new, STEP_SIZE_BOUNDS[0]), STEP_SIZE_BOUNDS[1])


def population_metric(x: Float[Array, " dim"], metric: Metric) -> Array | None:
    """The particles' variance (or covariance), inside the stage's `ensemble_map` body.

    Regularised like a sample estimate should be at any population size: a tiny floor
    relative to the largest variance, and 1 where it is not finite (a collapsed or
    non-finite population leaves the kernel usable)."""
    if metric is None:
        return None
    # Sums times one reciprocal, each product rounded before an addition sees it (as
    # WindowAdaptation does): a division or an FMA could compile differently for another
    # number of particles per device.
    inv_n = 1.0 / enn.num_chains()
    mean = enn.rounded(enn.chain_sum(x) * inv_n)
    d = x - mean
    if metric == "dense":
        cov = enn.rounded(enn.chain_sum(enn.rounded(d[:, None] * d[None, :])) * inv_n)
        cov = 0.5 * (cov + cov.T)
        scale = jnp.max(jnp.diagonal(cov))
        eye = jnp.eye(cov.shape[0], dtype=cov.dtype)
        cov = cov + enn.rounded(1e-8 * scale * eye)
        ok = jnp.all(jnp.isfinite(cov)) & jnp.all(jnp.diagonal(cov) > 0)
        return jnp.where(ok, cov, eye)
    var = enn.rounded(enn.chain_sum(enn.rounded(d * d)) * inv_n)
    var = jnp.maximum(var, 1e-12 * jnp.max(var))
    return jnp.where(jnp.isfinite(var) & (var > 0), var, jnp.ones_like(var))


def with_tuning(
    kernel: Sampler, step_size: Float[Array, ""], metric: Array | None, mode: str | None
) -> Sampler:
    """The kernel with this stage's step size and metric in its fields."""
    if mode == "imm":
        kernel = eqx.tree_at(
            lambda k: k.inverse_mass_matrix, kernel, metric, is_leaf=lambda v: v is None
        )
    if not has_field(kernel, "step_size"):
        return kernel
    if mode == "step":
        step_size = step_size * jnp.sqrt(metric)
    return eqx.tree_at(lambda k: k.step_size, kernel, step_size, is_leaf=lambda v: v is None)
