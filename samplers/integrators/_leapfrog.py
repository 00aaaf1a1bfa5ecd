"""The leapfrog integrator and the Gaussian kinetic energy shared by HMC and GHMC.

The inverse mass matrix `inverse_mass_matrix` may be a scalar, a diagonal `(dim,)` or a
dense `(dim, dim)` array; its number of dimensions (0, 1 or 2) says which. The kinetic
energy is `K(p) = p @ M^{-1} @ p / 2` and momenta are drawn from `N(0, M)`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from samplers.integrators import leapfrog
    >>> logdensity_and_grad = jax.value_and_grad(lambda x: -0.5 * (x**2).sum())
    >>> x, g = jnp.ones(2), -jnp.ones(2)
    >>> x1, p1, logp1, g1 = leapfrog(logdensity_and_grad, x, jnp.zeros(2), g,
    ...                              step_size=0.1, inverse_mass_matrix=1.0, num_steps=10)
    >>> [round(float(v), 3) for v in x1]   # x(t) = cos(t) from x = 1: cos(1) = 0.540
    [0.54, 0.54]
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.linalg import solve_triangular
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import random

LogdensityAndGrad = Callable[[Array], tuple[Float[Array, ""], Float[Array, " dim"]]]
InverseMassMatrix = Float[Array, ""] | Float[Array, " dim"] | Float[Array, "dim dim"] | float


def value_and_grad(logdensity: Callable[[Array], Float[Array, ""]]) -> LogdensityAndGrad:
    """`x -> (log p(x), grad log p(x))`, the value cast to the position's dtype.

    The cast keeps loop carries and scan states type-stable when a user's log-density
    returns a weakly typed or wider float.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.integrators import value_and_grad
        >>> value, grad = value_and_grad(lambda x: -0.5 * jnp.sum(x**2))(jnp.array([1.0, 2.0]))
        >>> float(value), grad.tolist()
        (-2.5, [-1.0, -2.0])
        >>> f = value_and_grad(lambda x: jnp.sum(x.astype(jnp.float32)))  # float32 value...
        >>> f(jnp.ones(2, jnp.bfloat16))[0].dtype                        # ...cast back
        dtype(bfloat16)
    """
    vg = jax.value_and_grad(logdensity)

    def fn(x: Float[Array, " dim"]) -> tuple[Float[Array, ""], Float[Array, " dim"]]:
        value, grad = vg(x)
        return value.astype(jnp.result_type(x)), grad.astype(jnp.result_type(x))

    return fn


def velocity(
    momentum: Float[Array, " dim"], inverse_mass_matrix: InverseMassMatrix
) -> Float[Array, " dim"]:
    """`M^{-1} p`, the time derivative of the position.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.integrators import velocity
        >>> p = jnp.array([1.0, 2.0])
        >>> velocity(p, 0.5).tolist(), velocity(p, jnp.array([1.0, 0.5])).tolist()
        ([0.5, 1.0], [1.0, 1.0])
        >>> velocity(p, jnp.array([[2.0, 0.0], [1.0, 1.0]])).tolist()   # dense
        [2.0, 3.0]
    """
    inverse_mass_matrix = jnp.asarray(inverse_mass_matrix)
    if inverse_mass_matrix.ndim == 2:
        return inverse_mass_matrix @ momentum
    return inverse_mass_matrix * momentum  # scalar or diagonal


def kinetic_energy(
    momentum: Float[Array, " dim"], inverse_mass_matrix: InverseMassMatrix
) -> Float[Array, ""]:
    """`p @ M^{-1} @ p / 2`.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.integrators import kinetic_energy
        >>> float(kinetic_energy(jnp.array([1.0, 2.0]), jnp.array([1.0, 0.5])))
        1.5
    """
    return 0.5 * jnp.vdot(momentum, velocity(momentum, inverse_mass_matrix))


def sample_momentum(
    position: Float[Array, " dim"], inverse_mass_matrix: InverseMassMatrix, key: PRNGKeyArray
) -> Float[Array, " dim"]:
    """A draw of `p ~ N(0, M)`, shaped and typed like `position`.

    For a dense matrix, with `L` the lower Cholesky factor of `M^{-1} = L L^T`, the draw is
    `p = L^{-T} z`: its covariance `L^{-T} L^{-1} = M` is the mass matrix, and a triangular
    solve avoids forming `M` or its inverse explicitly.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.integrators import sample_momentum
        >>> sample_momentum(jnp.zeros(3), jnp.eye(3), jax.random.key(0)).shape
        (3,)
    """
    z = random.normal(key, jnp.shape(position), jnp.result_type(position))
    inverse_mass_matrix = jnp.asarray(inverse_mass_matrix)
    if inverse_mass_matrix.ndim == 2:
        chol = jnp.linalg.cholesky(inverse_mass_matrix)
        return solve_triangular(chol, z, lower=True, trans="T")
    return z * lax.rsqrt(inverse_mass_matrix.astype(z.dtype))  # scalar or diagonal


def leapfrog(
    logdensity_and_grad: LogdensityAndGrad,
    position: Float[Array, " dim"],
    momentum: Float[Array, " dim"],
    grad: Float[Array, " dim"],
    step_size: Float[Array, ""] | float,
    inverse_mass_matrix: InverseMassMatrix,
    num_steps: Int[Array, ""] | int,
    logdensity: Float[Array, ""] | None = None,
) -> tuple[Float[Array, " dim"], Float[Array, " dim"], Float[Array, ""], Float[Array, " dim"]]:
    """`num_steps` leapfrog (kick-drift-kick) steps of Hamiltonian dynamics.

    Each step costs one gradient: `grad` (the gradient of the log-density at `position`)
    is given, so the first half kick needs none, and between two drifts the two half kicks
    are one kick with the gradient there (the loop carries only position and momentum; the
    log-density is evaluated once, at the end). `num_steps` may be a traced
    integer, different for each chain under `vmap` (a `while_loop` then runs until the
    longest trajectory is done, the shorter ones standing still).

    Args:
        logdensity_and_grad: `x -> (log p(x), grad log p(x))`.
        position, momentum, grad: the starting point and the gradient there.
        step_size: the integration step.
        inverse_mass_matrix: scalar, diagonal `(dim,)` or dense `(dim, dim)`.
        num_steps: how many steps.
        logdensity: log p at `position`; only returned as is when `num_steps` is 0.

    Returns:
        `(position, momentum, logdensity, grad)` at the end of the trajectory.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.integrators import leapfrog, value_and_grad
        >>> vg = value_and_grad(lambda x: -0.5 * jnp.sum(x**2))
        >>> x, p, logp, g = leapfrog(vg, jnp.zeros(1), jnp.ones(1), jnp.zeros(1),
        ...                          step_size=0.5, inverse_mass_matrix=1.0, num_steps=1)
        >>> x.tolist(), p.tolist(), float(logp), g.tolist()
        ([0.5], [0.875], -0.125, [-0.5])
    """
    step_size = jnp.asarray(step_size, jnp.result_type(position))
    logp0 = (
        jnp.full((), jnp.nan, jnp.result_type(position))
        if logdensity is None
        else (jnp.asarray(logdensity))
    )

    def full_step(_: Int[Array, ""], carry: tuple) -> tuple:
        # Between two drifts the two half kicks are one kick with the gradient there, so
        # the loop carries only (x, p): on a cheap gradient, each carried array costs one
        # kernel, and the gradient itself fuses into the kick.
        x, p = carry
        p = p + step_size * logdensity_and_grad(x)[1].astype(grad.dtype)
        return x + step_size * velocity(p, inverse_mass_matrix), p

    def trajectory(n: Int[Array, ""] | int) -> tuple:
        p = momentum + 0.5 * step_size * grad
        x = position + step_size * velocity(p, inverse_mass_matrix)
        x, p = lax.fori_loop(0, n - 1, full_step, (x, p))
        logp, g = logdensity_and_grad(x)
        logp, g = logp.astype(logp0.dtype), g.astype(grad.dtype)
        return x, p + 0.5 * step_size * g, logp, g

    start = (position, momentum, logp0, grad)
    if isinstance(num_steps, int):
        return trajectory(num_steps) if num_steps > 0 else start
    end = trajectory(jnp.maximum(num_steps, 1))
    return tuple(jnp.where(num_steps > 0, a, b) for a, b in zip(end, start, strict=True))
