"""Stochastic-gradient MCMC: SGLD (Welling & Teh 2011) and SGHMC (Chen, Fox & Guestrin 2014).

Log-density protocol: `logdensity(position, batch_indices)` returns an unbiased estimate of
the full-data log density (e.g. `log prior + num_data / batch_size * sum of the batch's log
likelihoods`), for example `samplers.targets.LogisticRegression.minibatch_logdensity`. Each
chain draws its own `batch_indices` (shape `(batch_size,)`, values in `[0, num_data)`) from its
key; the data itself stays a broadcast operand.

Positions are flat `(dim,)` arrays. To sample a pytree (e.g. the parameters of an equinox
MLP), ravel it outside the kernel::

    flat, unravel = jax.flatten_util.ravel_pytree(params)
    logdensity = lambda x, idx: model_logdensity(unravel(x), idx)

and unravel the sampled positions afterwards.

Both kernels keep the gradient estimate at the current position in the state (computed with
a batch drawn independently of the position), so a step costs one gradient evaluation, and
`state.logdensity` is the minibatch estimate at the current position.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import random
from .._errors import SamplerError, SamplerTypeError
from ._base import Hyper, Info, Sampler, State, hyperparameter, resolve
from ._transition import all_finite, select

__all__ = ["SGLD", "SGLDState", "SGHMC", "SGHMCState"]


class SGLDState(State):
    """One chain of SGLD: `State` plus the gradient estimate at the position.

    Attributes:
        grad: minibatch estimate of `grad log p(position)`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> data = jnp.ones(100)   # identical data: every minibatch gives the same estimate
        >>> logdensity = lambda x, idx: -0.5 * 100 * jnp.mean((x[0] - data[idx]) ** 2)
        >>> kernel = samplers.SGLD(step_size=1e-3, batch_size=10, num_data=100)
        >>> state = kernel.init(logdensity, jnp.zeros(1), jax.random.key(0))
        >>> isinstance(state, samplers.SGLDState), state.grad.tolist()
        (True, [100.0])
    """

    grad: Float[Array, " dim"]


class SGHMCState(SGLDState):
    """One chain of SGHMC: `SGLDState` plus the momentum (in position units per step).

    Attributes:
        momentum: the velocity `v` added to the position each step.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> data = jnp.ones(100)
        >>> logdensity = lambda x, idx: -0.5 * 100 * jnp.mean((x[0] - data[idx]) ** 2)
        >>> kernel = samplers.SGHMC(step_size=1e-3, batch_size=10, num_data=100)
        >>> state = kernel.init(logdensity, jnp.zeros(1), jax.random.key(0))
        >>> isinstance(state, samplers.SGHMCState), state.grad.tolist(), state.momentum.shape
        (True, [100.0], (1,))
    """

    momentum: Float[Array, " dim"]


class _StochasticGradient(Sampler):
    """Shared pieces: minibatch drawing and the gradient estimate."""

    adjusted = False  # no Metropolis correction: acceptance is 1 (0 if non-finite)

    def __check_init__(self) -> None:
        # Both fix array shapes (the batch) and the index range: Python ints only.
        kernel = type(self).__name__
        for name in ("batch_size", "num_data"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise SamplerTypeError(
                    f"{kernel}.{name} must be a Python int, got {value!r} "
                    f"({type(value).__name__}); it fixes the minibatch's shape.\n  fix: "
                    f"{kernel}(step_size=..., batch_size=32, num_data=len(data))."
                )
        if self.num_data < 1:
            raise SamplerError(f"{kernel}.num_data must be >= 1, got {self.num_data}.")
        if not self.replace and self.batch_size > self.num_data:
            raise SamplerError(
                f"{kernel}.batch_size={self.batch_size} exceeds num_data={self.num_data}, "
                "so a batch cannot be drawn without replacement.\n  fix: a batch_size <= "
                "num_data, or replace=True."
            )

    def batch_indices(self, key: PRNGKeyArray) -> Int[Array, " batch_size"]:
        """This chain's minibatch: `batch_size` indices into the data.

        Drawn with replacement by default (cheap for any `num_data`, still unbiased); set
        `replace=False` to draw without replacement.
        """
        if self.replace:
            return random.randint(key, (self.batch_size,), 0, self.num_data)
        # Left to jax.random: its `choice` is a shuffle by repeated sorts, not drawn here.
        return jax.random.choice(key, self.num_data, (self.batch_size,), replace=False)

    def estimate(
        self, logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> tuple[Float[Array, ""], Float[Array, " dim"]]:
        """Minibatch estimate of `(log p, grad log p)` at `position` with a fresh batch."""
        indices = self.batch_indices(key)
        return jax.value_and_grad(logdensity)(position, indices)


class SGLD(_StochasticGradient):
    """Stochastic-gradient Langevin dynamics for one chain.

    Update, with `eps = step_size` and the minibatch gradient estimate `g`:
    `x <- x + eps * g + sqrt(2 * eps * temperature) * N(0, I)`, the Euler discretisation of
    the Langevin diffusion whose stationary law is `p^(1/temperature)`. The step size is
    usually decreasing (an optax schedule of the step count, e.g.
    `optax.polynomial_schedule`) to remove the discretisation bias.

    Attributes:
        step_size: `eps` (number, array, `enn.PerChainValue` or schedule).
        batch_size: minibatch size (static).
        num_data: number of data points the indices range over (static).
        temperature: 1 samples the posterior; 0 gives stochastic gradient ascent.
        replace: draw batch indices with replacement (static).

    `Info.step_size` is the step size used at that step; a non-finite update is reverted
    and flagged `is_divergent` (acceptance 0).

    Example:
        >>> import jax, jax.numpy as jnp, optax, samplers
        >>> data = jnp.linspace(-1.0, 1.0, 100)
        >>> logdensity = lambda x, idx: -0.5 * jnp.sum(x**2) - 100 / 10 * 0.5 * jnp.sum(
        ...     (x[0] - data[idx]) ** 2)
        >>> kernel = samplers.SGLD(step_size=optax.linear_schedule(1e-2, 1e-3, 100),
        ...                        batch_size=10, num_data=100)
        >>> state = kernel.init(logdensity, jnp.zeros(1), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(state.count), round(float(info.step_size), 6)
        (1, 0.01)
    """

    step_size: Hyper = hyperparameter(positive=True)
    batch_size: int = hyperparameter(positive=True, integer=True, static=True)
    num_data: int = eqx.field(static=True)
    temperature: Hyper = hyperparameter(nonnegative=True, default=1.0)
    replace: bool = eqx.field(static=True, default=True)

    def init(self, logdensity, position: Float[Array, " dim"], key: PRNGKeyArray) -> SGLDState:
        """Start at `position`, with a gradient estimate from a batch drawn from `key`."""
        position = jnp.asarray(position)
        logp, grad = self.estimate(logdensity, position, key)
        return SGLDState(position, logp, jnp.zeros((), jnp.int32), grad)

    def step(self, logdensity, state: SGLDState, key: PRNGKeyArray) -> tuple[SGLDState, Info]:
        step_size = resolve(self.step_size, state.count)
        temperature = resolve(self.temperature, state.count)
        key_noise, key_batch = random.split(key)
        noise = random.normal(key_noise, state.position.shape, state.position.dtype)
        position = (
            state.position
            + step_size * state.grad
            + jnp.sqrt(2.0 * step_size * temperature) * noise
        )
        logp, grad = self.estimate(logdensity, position, key_batch)
        finite = all_finite(position, logp, grad)
        new = SGLDState(position, logp, state.count + 1, grad)
        kept = SGLDState(state.position, state.logdensity, state.count + 1, state.grad)
        info = Info(
            acceptance_rate=finite.astype(position.dtype),
            is_divergent=~finite,
            num_grads=jnp.int32(1),
            energy_change=jnp.zeros((), position.dtype),
            step_size=jnp.asarray(step_size, position.dtype),
        )
        return select(finite, new, kept), info


class SGHMC(_StochasticGradient):
    """Stochastic-gradient Hamiltonian Monte Carlo for one chain (momentum form).

    In the "SGD with momentum" parametrisation of Chen, Fox & Guestrin (2014, sec. 3.3),
    with learning rate `eta = step_size`, friction `alpha = friction` and the minibatch
    gradient estimate `g`:

        v <- (1 - alpha) v + eta * g + sqrt(2 * alpha * eta * temperature) * N(0, I)
        x <- x + v

    (no estimate of the gradient-noise covariance is subtracted, i.e. `beta_hat = 0`). This
    is the physical SGHMC with step `sqrt(eta)`, unit mass and friction `alpha/sqrt(eta)`;
    at stationarity `v ~ N(0, eta * temperature)`, which is also how `init` draws it. The
    momentum persists between steps.

    Attributes:
        step_size: the learning rate `eta` (number, array, `enn.PerChainValue` or schedule).
        batch_size: minibatch size (static).
        num_data: number of data points the indices range over (static).
        friction: `alpha` in (0, 1]; `friction=1` is exactly `SGLD(step_size=eta)`, and
            small values mean a long momentum memory.
        temperature: 1 samples the posterior.
        replace: draw batch indices with replacement (static).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> data = jnp.linspace(-1.0, 1.0, 100)
        >>> logdensity = lambda x, idx: -0.5 * jnp.sum(x**2) - 100 / 10 * 0.5 * jnp.sum(
        ...     (x[0] - data[idx]) ** 2)
        >>> kernel = samplers.SGHMC(step_size=1e-3, batch_size=10, num_data=100)
        >>> state = kernel.init(logdensity, jnp.zeros(1), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(state.count), state.momentum.shape
        (1, (1,))
    """

    step_size: Hyper = hyperparameter(positive=True)
    batch_size: int = hyperparameter(positive=True, integer=True, static=True)
    num_data: int = eqx.field(static=True)
    friction: Hyper = hyperparameter(positive=True, maximum=1.0, default=0.1)
    temperature: Hyper = hyperparameter(nonnegative=True, default=1.0)
    replace: bool = eqx.field(static=True, default=True)

    def init(self, logdensity, position: Float[Array, " dim"], key: PRNGKeyArray) -> SGHMCState:
        """Start at `position` with momentum drawn from its stationary law at step 0."""
        position = jnp.asarray(position)
        key_batch, key_momentum = random.split(key)
        logp, grad = self.estimate(logdensity, position, key_batch)
        scale = jnp.sqrt(resolve(self.step_size, 0) * resolve(self.temperature, 0))
        momentum = scale * random.normal(key_momentum, position.shape, position.dtype)
        return SGHMCState(position, logp, jnp.zeros((), jnp.int32), grad, momentum)

    def step(self, logdensity, state: SGHMCState, key: PRNGKeyArray) -> tuple[SGHMCState, Info]:
        eta = resolve(self.step_size, state.count)
        alpha = resolve(self.friction, state.count)
        temperature = resolve(self.temperature, state.count)
        key_noise, key_batch = random.split(key)
        noise = random.normal(key_noise, state.position.shape, state.position.dtype)
        momentum = (
            (1.0 - alpha) * state.momentum
            + eta * state.grad
            + jnp.sqrt(2.0 * alpha * eta * temperature) * noise
        )
        position = state.position + momentum
        logp, grad = self.estimate(logdensity, position, key_batch)
        finite = all_finite(position, momentum, logp, grad)
        new = SGHMCState(position, logp, state.count + 1, grad, momentum)
        # A reverted step also drops the momentum, which is what blew up.
        kept = SGHMCState(
            state.position,
            state.logdensity,
            state.count + 1,
            state.grad,
            jnp.zeros_like(state.momentum),
        )
        info = Info(
            acceptance_rate=finite.astype(position.dtype),
            is_divergent=~finite,
            num_grads=jnp.int32(1),
            energy_change=jnp.zeros((), position.dtype),
            step_size=jnp.asarray(eta, position.dtype),
        )
        return select(finite, new, kept), info
