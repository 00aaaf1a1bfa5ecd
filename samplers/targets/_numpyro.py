"""NumPyro models as targets: `from_numpyro(model, *args, **kwargs)`.

NumPyro is an optional extra (`pip install 'ensemblenn[numpyro]'`); it is imported when
`from_numpyro` is called.
"""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

import ensemblenn as enn

from .._errors import SamplerError

__all__ = ["NumPyroTarget", "from_numpyro"]


def _numpyro_util() -> Any:
    try:
        from numpyro.infer import util
    except ImportError:
        raise ImportError(
            "samplers.targets.from_numpyro needs NumPyro, which is not installed.\n  fix: "
            "pip install 'ensemblenn[numpyro]'"
        ) from None
    return util


class NumPyroTarget(eqx.Module):
    """A NumPyro model's posterior over its unconstrained latent sites (a dict pytree).

    `target(position)` is the log joint density of one chain's unconstrained values (the
    negative of NumPyro's potential energy, Jacobians included); `observable(position)`
    maps them to the constrained site values (plus the model's floating `deterministic`
    sites), which is what `samplers.run` reports. The model's arguments are fields, so
    the data enter the ensemble's `shard_map` as operands.

    Attributes:
        model: the NumPyro model (a Python callable).
        model_args, model_kwargs: its arguments (the data).
        sites: `(name, unconstrained shape)` of each latent site (`shapes` as a dict).
        deterministic: the names of the deterministic sites `observable` reports.
        reference: None (no known moments).

    Example:
        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist, samplers
        >>> def model(y):
        ...     scale = numpyro.sample("scale", dist.HalfNormal(1.0))
        ...     numpyro.sample("y", dist.Normal(0.0, scale), obs=y)
        >>> target = samplers.targets.from_numpyro(model, jnp.array([0.5, -1.0]))
        >>> target.shapes
        {'scale': ()}
        >>> x = target.initial_positions(jax.random.key(0), num_chains=4)
        >>> x["scale"].shape, bool((target.observable({"scale": 0.0})["scale"] == 1.0))
        ((4,), True)
    """

    model: Callable = eqx.field(static=True)
    model_args: tuple
    model_kwargs: dict
    sites: tuple[tuple[str, tuple[int, ...]], ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    deterministic: tuple[str, ...] = eqx.field(static=True)
    reference: Any = None

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The unconstrained shape of each latent site, by name."""
        return dict(self.sites)

    def __call__(self, position: dict) -> Float[Array, ""]:
        util = _numpyro_util()
        energy = util.potential_energy(self.model, self.model_args, self.model_kwargs, position)
        return -energy

    def observable(self, position: dict) -> dict:
        """The constrained values of the latent sites (and floating deterministic sites)."""
        util = _numpyro_util()
        values = util.constrain_fn(
            self.model, self.model_args, self.model_kwargs, position,
            return_deterministic=bool(self.deterministic),
        )  # fmt: skip
        keep = set(self.shapes) | set(self.deterministic)
        return {name: value for name, value in values.items() if name in keep}

    def log_likelihood(self, position: dict) -> Float[Array, ""]:
        """The log density of the observed sites (the data, and `numpyro.factor` terms) at
        one chain's unconstrained values: `samplers.SMC`'s likelihood.

        Masks and `numpyro.handlers.scale` apply as in NumPyro's log joint. With
        `log_prior`, it sums to the target's log density.

        Example:
            >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist, samplers
            >>> def model(y):
            ...     mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
            ...     numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
            >>> target = samplers.targets.from_numpyro(model, jnp.array([1.0]))
            >>> round(float(target.log_likelihood({"mu": jnp.float32(1.0)})), 4)  # log N(1; 1, 1)
            -0.9189
        """
        util = _numpyro_util()
        args, kwargs = self.model_args, self.model_kwargs
        constrained = util.constrain_fn(self.model, args, kwargs, position)
        _, trace = util.log_density(self.model, args, kwargs, constrained)
        total = jnp.zeros((), self.dtype)
        for site in trace.values():
            if site["type"] != "sample" or not site.get("is_observed", False):
                continue
            value = site["value"]
            if site.get("intermediates"):
                log_prob = site["fn"].log_prob(value, site["intermediates"])
            else:
                log_prob = site["fn"].log_prob(value)
            if site.get("mask") is not None:
                log_prob = jnp.where(site["mask"], log_prob, 0.0)
            if site.get("scale") is not None:
                log_prob = site["scale"] * log_prob
            total = total + jnp.sum(log_prob)
        return total

    def log_prior(self, position: dict) -> Float[Array, ""]:
        """The log prior density of one chain's unconstrained values: the latent sites'
        densities with the Jacobians of their transforms to the unconstrained scale (a
        normalised density there, when the model's priors are proper): `samplers.SMC`'s
        prior.

        Example:
            >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist, samplers
            >>> def model():
            ...     numpyro.sample("scale", dist.Exponential(1.0))
            >>> target = samplers.targets.from_numpyro(model)
            >>> # u = log(scale): density exp(-e^u) e^u, at u = 0: -1 + 0
            >>> float(target.log_prior({"scale": jnp.float32(0.0)}))
            -1.0
        """
        return self(position) - self.log_likelihood(position)

    def prior_particles(self, key: PRNGKeyArray, num_particles: int) -> dict:
        """Independent draws of the prior on the unconstrained scale, one per particle:
        `samplers.SMC`'s initial particles (a dict, leaves `(num_particles, *shape)`).

        Raises:
            samplers.SamplerError: a latent site's prior cannot be sampled (an improper
                prior such as `dist.ImproperUniform`): SMC needs draws of a proper prior,
                and its log evidence a normalised one.

        Example:
            >>> import jax, numpyro, numpyro.distributions as dist, samplers
            >>> def model():
            ...     numpyro.sample("scale", dist.Exponential(1.0))
            >>> target = samplers.targets.from_numpyro(model)
            >>> target.prior_particles(jax.random.key(0), 256)["scale"].shape
            (256,)
        """
        util = _numpyro_util()
        from numpyro import handlers

        args, kwargs = self.model_args, self.model_kwargs

        def draw(k: PRNGKeyArray) -> dict:
            trace = handlers.trace(handlers.seed(self.model, k)).get_trace(*args, **kwargs)
            values = {name: trace[name]["value"] for name, _ in self.sites}
            return util.unconstrain_fn(self.model, args, kwargs, values)

        try:
            draws = jax.vmap(draw)(jax.random.split(key, num_particles))
        except NotImplementedError as err:
            why = str(err) or "an improper prior"
            raise SamplerError(
                f"prior_particles: a latent site's prior cannot be sampled ({why}).\n  fix: "
                "give every latent site a proper prior distribution; SMC starts from draws "
                "of the prior, and its log evidence is relative to the prior's normalisation."
            ) from None
        return {name: jnp.asarray(draws[name], self.dtype) for name, _ in self.sites}

    def initial_positions(self, key: PRNGKeyArray, num_chains: int) -> dict:
        """Starting points as NumPyro's `init_to_uniform` draws them: uniform in (-2, 2) on
        the unconstrained scale, independently per chain and site."""
        return _uniform_draws(key, self.sites, self.dtype, int(num_chains))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _uniform_draws(key: PRNGKeyArray, sites: tuple, dtype: Any, num_chains: int) -> dict:
    """`initial_positions`' draws as one program: eagerly, the split, the unstacking of its
    keys and each shape's draw were a program each (the same bits either way)."""
    keys = jax.random.split(key, len(sites))
    return {
        name: jax.random.uniform(k, (num_chains, *shape), dtype, minval=-2.0, maxval=2.0)
        for k, (name, shape) in zip(keys, sites, strict=True)
    }


def from_numpyro(model: Callable, *model_args: Any, **model_kwargs: Any) -> NumPyroTarget:
    """A target over the unconstrained latent sites of a NumPyro model.

    Args:
        model: a NumPyro model (a callable with `numpyro.sample` statements).
        *model_args, **model_kwargs: the model's arguments (its data).

    Returns:
        A `NumPyroTarget`: pass it to `samplers.run` as the log density, with positions
        from `target.initial_positions(key, num_chains)` (a dict, one entry per site).

    Raises:
        ImportError: NumPyro is not installed (`pip install 'ensemblenn[numpyro]'`).
        enn.EnsembleError: the model has discrete latent sites, or none at all.

    Example:
        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist, samplers
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> target = samplers.targets.from_numpyro(model, jnp.array([1.0, 2.0, 3.0]))
        >>> result = samplers.run(samplers.MALA(0.5), target,
        ...                       target.initial_positions(jax.random.key(0), 8),
        ...                       key=jax.random.key(1), num_steps=200, progress=False)
        >>> result.names
        ('mu',)
    """
    util = _numpyro_util()
    from numpyro import handlers

    def describe() -> dict:
        """The model's static structure, from one trace and NumPyro's own initialisation."""
        key = jax.random.key(0)  # only to trace the model: the sites' shapes, not values
        model_trace = handlers.trace(handlers.seed(model, key)).get_trace(
            *model_args, **model_kwargs
        )
        discrete = [
            name
            for name, site in model_trace.items()
            if site["type"] == "sample"
            and not site.get("is_observed", False)
            and getattr(site["fn"], "support", None) is not None
            and site["fn"].support.is_discrete
        ]
        if discrete:
            raise enn.EnsembleError(
                f"from_numpyro: the model has discrete latent sites {discrete}; the samplers "
                "move continuous parameters only.\n  fix: marginalise them out of the model "
                "(or observe them)."
            )
        info = util.initialize_model(key, model, model_args=model_args, model_kwargs=model_kwargs)
        z = info.param_info.z
        if not z:
            raise enn.EnsembleError("from_numpyro: the model has no latent sample sites to sample.")
        found["sites"] = tuple(sorted((name, tuple(jnp.shape(v))) for name, v in z.items()))
        found["dtype"] = jnp.result_type(*jax.tree.leaves(z))
        found["deterministic"] = tuple(
            name
            for name, site in model_trace.items()
            if site["type"] == "deterministic"
            and jnp.issubdtype(jnp.result_type(site["value"]), jnp.floating)
        )
        return {}

    found: dict = {}
    try:
        # Abstractly: run eagerly, the model and NumPyro's initialisation are ~90 one-op
        # programs, each compiled (or loaded from the persistent cache) in a fresh process,
        # seconds before the first step; only shapes and dtypes are needed.
        jax.eval_shape(describe)
    except jax.errors.JAXTypeError:
        describe()  # a model that needs concrete values (e.g. Python `if` on a draw)
    return NumPyroTarget(
        model=model,
        model_args=tuple(model_args),
        model_kwargs=dict(model_kwargs),
        sites=found["sites"],
        dtype=found["dtype"],
        deterministic=found["deterministic"],
    )
