"""Dual averaging of `log step_size` towards a target acceptance (Hoffman and Gelman 2014,
Algorithm 5, with Stan's constants), shared by ChEES and WindowAdaptation."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

GAMMA = 0.05
T0 = 10.0
KAPPA = 0.75


class DualAveraging(eqx.Module):
    """Dual averaging state for `log step_size` (Hoffman and Gelman 2014, Algorithm 5)."""

    log_step_size: Float[Array, ""]
    log_averaged: Float[Array, ""]
    error_sum: Float[Array, ""]
    shrink_to: Float[Array, ""]

    def update(
        self, acceptance: Float[Array, ""], target: float, iteration: Int[Array, ""]
    ) -> "DualAveraging":
        m = iteration.astype(jnp.float32)
        w = 1.0 / (m + T0)
        error_sum = (1.0 - w) * self.error_sum + w * (target - acceptance)
        log_step = self.shrink_to - jnp.sqrt(m) / GAMMA * error_sum
        weight = m ** (-KAPPA)
        log_averaged = weight * log_step + (1.0 - weight) * self.log_averaged
        return DualAveraging(log_step, log_averaged, error_sum, self.shrink_to)
