"""Isokinetic integrators for microcanonical (MCLMC / MAMS) dynamics.

The isokinetic (ESH) dynamics of Steeg & Galstyan and Robnik et al. move a position `x`
with a velocity `u` of fixed unit norm. In the coordinates whitened by a diagonal
preconditioner, `z = x / sqrt(m)` with `m` the inverse mass matrix (think: the
target's variances), the equations of motion are

    dz/dt = u,        du/dt = (I - u u^T) g / (d - 1),      g = sqrt(m) * grad log p(x).

Both pieces have exact flows, so symmetric splittings of them give symplectic-like
integrators of any even order:

* the position flow ("A"): `x <- x + eps * sqrt(m) * u`;
* the velocity flow ("B"), with `e = g/|g|`, `c = u.e` and `delta = eps |g| / (d - 1)`:

      u <- (u + e (sinh delta + c (cosh delta - 1))) / (cosh delta + c sinh delta),

  which keeps `|u| = 1` and changes the isokinetic kinetic energy by
  `(d - 1) log(cosh delta + c sinh delta)`. The sum of that kinetic change and the
  change of `-log p` is the energy error the adjusted kernel accepts on; it is zero for
  the exact flow.

An integrator is a palindromic sequence of B and A stages starting with B. The first B
uses the gradient cached in the state, so an integrator costs one gradient per A stage.

Dimension must be at least 2 (the velocity lives on the unit sphere of dimension d-1).
"""

import math
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .. import random
from .._errors import SamplerError, SamplerTypeError
from ._leapfrog import value_and_grad as _value_and_grad

Logdensity = Callable[[Array], Float[Array, ""]]

__all__ = [
    "IntegratorState",
    "IsokineticIntegrator",
    "INTEGRATORS",
    "get_integrator",
    "isokinetic_position_update",
    "isokinetic_velocity_update",
    "partially_refresh_velocity",
    "random_unit_vector",
]

# McLachlan's minimal-norm two-stage coefficient (second order, smallest error constant).
_MCLACHLAN_LAMBDA = 0.1931833275037836
# Omelyan, Mryglod & Folk (2002) fourth-order Forest-Ruth-like minimal-norm coefficients.
_OMELYAN_XI = 0.1720865590295143
_OMELYAN_LAMBDA = -0.09156203075515678
_OMELYAN_CHI = -0.1616217622107222


class IntegratorState(eqx.Module):
    """Phase-space point of one chain: position, unit velocity, and the cached target.

    Attributes:
        position: the position `x`, shape `(dim,)`.
        velocity: the unit-norm velocity `u` (in whitened coordinates), shape `(dim,)`.
        logdensity: `log p(x)`.
        grad: `grad log p(x)` with respect to `x` (not whitened).

    Example:
        >>> import jax, jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> x = jnp.array([3.0, 4.0])
        >>> state = iso.IntegratorState(x, jnp.array([1.0, 0.0]), logdensity(x),
        ...                             jax.grad(logdensity)(x))
        >>> float(state.logdensity), state.grad.tolist()
        (-12.5, [-3.0, -4.0])
        >>> new, _ = iso.get_integrator("leapfrog")(logdensity, state, 0.1)
        >>> new.position.shape, round(float(jnp.linalg.norm(new.velocity)), 5)
        ((2,), 1.0)
    """

    position: Float[Array, " dim"]
    velocity: Float[Array, " dim"]
    logdensity: Float[Array, ""]
    grad: Float[Array, " dim"]


def _sqrt_imm(inverse_mass_matrix: Array) -> Array:
    return jnp.sqrt(jnp.asarray(inverse_mass_matrix))


def isokinetic_position_update(
    position: Float[Array, " dim"],
    velocity: Float[Array, " dim"],
    step_size: Float[Array, ""] | float,
    inverse_mass_matrix: Array | float = 1.0,
) -> Float[Array, " dim"]:
    """Exact position flow for time `step_size`: `x + step_size * sqrt(m) * u`.

    Example:
        >>> import jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> iso.isokinetic_position_update(jnp.zeros(2), jnp.array([1.0, 0.0]), 0.5, 4.0)
        Array([1., 0.], dtype=float32)
    """
    # sqrt(m) * u first: with a float32 `m` and float64 positions, `step_size * sqrt(m)`
    # would round the step to float32 and break the splitting's consistency.
    return position + step_size * (_sqrt_imm(inverse_mass_matrix) * velocity)


def isokinetic_velocity_update(
    velocity: Float[Array, " dim"],
    grad: Float[Array, " dim"],
    step_size: Float[Array, ""] | float,
    inverse_mass_matrix: Array | float = 1.0,
) -> tuple[Float[Array, " dim"], Float[Array, ""]]:
    """Exact isokinetic velocity flow for time `step_size` under a fixed gradient.

    Args:
        velocity: unit velocity `u`.
        grad: `grad log p(x)` (in `x` coordinates; whitened here with `sqrt(m)`).
        step_size: the time to flow for.
        inverse_mass_matrix: diagonal `m`, shape `(dim,)` or scalar.

    Returns:
        `(new_velocity, kinetic_energy_change)`; `new_velocity` has unit norm.

    Example:
        >>> import jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> u, dk = iso.isokinetic_velocity_update(jnp.array([1.0, 0.0, 0.0]),
        ...                                        jnp.array([0.0, 3.0, 0.0]), 10.0)
        >>> float(jnp.linalg.norm(u)), bool(u[1] > 0.99)
        (1.0, True)
    """
    dim = velocity.shape[-1]
    g = _sqrt_imm(inverse_mass_matrix) * grad
    g_norm = jnp.linalg.norm(g)
    # A zero gradient must leave u untouched rather than produce 0/0.
    e = g / jnp.where(g_norm > 0, g_norm, 1.0)
    # 1 + c from the vectors themselves (|e + u|^2 = 2 + 2c) for the kinetic change: as
    # 1 + jnp.dot(e, u) it cancels to 0 when u is nearly -e, and with exp(-2 delta)
    # underflowed the update was 0/0 (a NaN proposal: rare 2-D divergences). 1 - c = 2 - a
    # is accurate wherever it is not negligible beside a.
    plus = e + velocity
    a = 0.5 * jnp.dot(plus, plus)  # 1 + c
    b = jnp.maximum(2.0 - a, 0.0)  # 1 - c
    delta = step_size * g_norm / (dim - 1)
    # The exact update multiplied through by 2 exp(-delta), so large delta cannot overflow
    # cosh/sinh. (Its e-term equals (1 - q)(a + q b), which stays accurate as c -> -1, but
    # that form broke bitwise device-count invariance on jax 0.12: XLA fuses it per program.)
    q = jnp.exp(-delta)
    numerator = 2.0 * q * velocity + e * ((1.0 - q * q) + jnp.dot(e, velocity) * (1.0 - q) ** 2)
    # Renormalise: the exact map has |u| = 1; this stops round-off from accumulating. A zero
    # numerator (u exactly -e, everything underflowed) is the flow's fixed point: keep u.
    norm = jnp.linalg.norm(numerator)
    new_velocity = jnp.where(norm > 0, numerator / jnp.where(norm > 0, norm, 1.0), velocity)
    # (d - 1) log(cosh delta + c sinh delta) = (d - 1) (delta + log((a + b q^2) / 2)).
    log_denominator = jnp.logaddexp(jnp.log(a), jnp.log(b) - 2.0 * delta)
    kinetic_change = (dim - 1) * (delta + log_denominator - math.log(2.0))
    return new_velocity, kinetic_change


def random_unit_vector(
    dim: int, key: PRNGKeyArray, dtype: jnp.dtype = jnp.float32
) -> Float[Array, " dim"]:
    """A uniformly distributed direction on the unit sphere in `dim` dimensions.

    Example:
        >>> import jax, jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> round(float(jnp.linalg.norm(iso.random_unit_vector(5, jax.random.key(0)))), 5)
        1.0
    """
    z = random.normal(key, (dim,), dtype)
    return z / jnp.linalg.norm(z)


def partially_refresh_velocity(
    velocity: Float[Array, " dim"],
    step_size: Float[Array, ""] | float,
    L: Float[Array, ""] | float,
    key: PRNGKeyArray,
) -> Float[Array, " dim"]:
    """Partial velocity refresh with decoherence length `L` (the Langevin noise of MCLMC).

    `u <- normalise(c u + sqrt(1 - c^2) z / sqrt(d))` with `c = exp(-step_size / L)` and
    `z ~ N(0, I)`. This keeps the uniform distribution on the sphere invariant; `L = inf`
    means no refresh. `z / sqrt(d)` has about unit norm, so `L` is the distance over which
    the direction decorrelates.

    Example:
        >>> import jax, jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> u = jnp.array([1.0, 0.0, 0.0])
        >>> bool((iso.partially_refresh_velocity(u, 1.0, jnp.inf, jax.random.key(0)) == u).all())
        True
    """
    dim = velocity.shape[-1]
    c = jnp.exp(-step_size / L)
    z = random.normal(key, velocity.shape, velocity.dtype)
    new = c * velocity + jnp.sqrt(1.0 - c * c) * z / math.sqrt(dim)
    return new / jnp.linalg.norm(new)


class IsokineticIntegrator(eqx.Module):
    """A palindromic splitting integrator of the isokinetic dynamics.

    `coefficients` is the first half of the stage sequence up to and including the middle
    stage, alternating B (velocity) and A (position) and starting with B; the full sequence
    mirrors it. Examples: leapfrog `(1/2, 1)` is B(1/2) A(1) B(1/2); McLachlan
    `(l, 1/2, 1 - 2l)` is B(l) A(1/2) B(1-2l) A(1/2) B(l).

    Attributes:
        coefficients: the half sequence described above (static).
        name: a label for repr and errors (static).

    Example:
        >>> import jax, jax.numpy as jnp, samplers.integrators.isokinetic as iso
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> x = jnp.ones(3)
        >>> state = iso.IntegratorState(x, iso.random_unit_vector(3, jax.random.key(0)),
        ...                             logdensity(x), jax.grad(logdensity)(x))
        >>> integrator = iso.get_integrator("mclachlan")
        >>> new, kinetic_change = integrator(logdensity, state, 0.1)
        >>> integrator.grads_per_step, round(float(jnp.linalg.norm(new.velocity)), 5)
        (2, 1.0)
    """

    coefficients: tuple[float, ...] = eqx.field(static=True)
    name: str = eqx.field(static=True, default="custom")

    def __check_init__(self):
        if not self.coefficients:
            raise SamplerError(
                "an isokinetic integrator needs at least one stage.\n  fix: "
                "IsokineticIntegrator(coefficients=(b1, a1, ...)) with its palindromic "
                "coefficients, or one of the named integrators."
            )

    @property
    def stages(self) -> tuple[tuple[str, float], ...]:
        """The full stage sequence as `("B" | "A", coefficient)` pairs."""
        half = list(self.coefficients)
        full = half + half[-2::-1]
        return tuple(("B" if i % 2 == 0 else "A", c) for i, c in enumerate(full))

    @property
    def grads_per_step(self) -> int:
        """New gradient evaluations per step: one per A stage (the first B is cached)."""
        return sum(1 for kind, _ in self.stages if kind == "A")

    def __call__(
        self,
        logdensity: Logdensity,
        state: IntegratorState,
        step_size: Float[Array, ""] | float,
        inverse_mass_matrix: Array | float = 1.0,
    ) -> tuple[IntegratorState, Float[Array, ""]]:
        """One integration step of length `step_size`.

        Returns:
            `(new_state, kinetic_energy_change)` summed over the B stages.
        """
        x, u = state.position, state.velocity
        logp, grad = state.logdensity, state.grad
        kinetic_change = jnp.zeros_like(logp)
        value_and_grad = _value_and_grad(logdensity)
        for kind, coef in self.stages:
            if kind == "B":
                u, dk = isokinetic_velocity_update(u, grad, coef * step_size, inverse_mass_matrix)
                kinetic_change = kinetic_change + dk
            else:
                x = isokinetic_position_update(x, u, coef * step_size, inverse_mass_matrix)
                logp, grad = value_and_grad(x)
        return IntegratorState(x, u, logp, grad), kinetic_change


INTEGRATORS: dict[str, IsokineticIntegrator] = {
    "leapfrog": IsokineticIntegrator((0.5, 1.0), "leapfrog"),
    "velocity_verlet": IsokineticIntegrator((0.5, 1.0), "velocity_verlet"),
    "mclachlan": IsokineticIntegrator(
        (_MCLACHLAN_LAMBDA, 0.5, 1.0 - 2.0 * _MCLACHLAN_LAMBDA), "mclachlan"
    ),
    "omelyan": IsokineticIntegrator(
        (
            _OMELYAN_XI,
            0.5 - _OMELYAN_LAMBDA,
            _OMELYAN_CHI,
            _OMELYAN_LAMBDA,
            1.0 - 2.0 * (_OMELYAN_XI + _OMELYAN_CHI),
        ),
        "omelyan",
    ),
}
"""Built-in integrators: `leapfrog` / `velocity_verlet` (1 gradient per step, 2nd order),
`mclachlan` (minimal-norm, 2 gradients, 2nd order, the MCLMC default) and `omelyan`
(Omelyan-Mryglod-Folk fourth-order Forest-Ruth-like, 4 gradients)."""

IntegratorName = Literal["leapfrog", "velocity_verlet", "mclachlan", "omelyan"]


def get_integrator(integrator: IntegratorName | IsokineticIntegrator) -> IsokineticIntegrator:
    """Look up a built-in integrator by name, or pass an `IsokineticIntegrator` through.

    Example:
        >>> import samplers.integrators.isokinetic as iso
        >>> iso.get_integrator("omelyan").grads_per_step
        4
    """
    if isinstance(integrator, IsokineticIntegrator):
        return integrator
    if not isinstance(integrator, str):
        raise SamplerTypeError(
            f"integrator must be a name ({sorted(INTEGRATORS)}) or an IsokineticIntegrator, "
            f"got {type(integrator).__name__}."
        )
    try:
        return INTEGRATORS[integrator]
    except KeyError:
        raise SamplerError(
            f"unknown isokinetic integrator {integrator!r}; choose one of "
            f"{sorted(INTEGRATORS)} or pass an IsokineticIntegrator"
        ) from None
