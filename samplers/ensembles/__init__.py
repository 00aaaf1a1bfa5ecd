"""Deep ensembles and SG-MCMC for neural networks, sharded over devices.

Two ways to get an ensemble of networks, both written for ONE member and run across the
ensemble by `enn.ensemble_map`:

* **Deep ensembles**: `init_ensemble` builds `num_members` equinox models from per-member
  keys, each with its own optax optimizer state (`DeepEnsemble`, both fields per-chain);
  `train_step` is one optimizer step of one member and `fit` runs many steps of every member
  in one compiled loop. The data are broadcast: one replicated copy serves every member.
* **SG-MCMC**: `MinibatchPosterior` turns a model, a log-likelihood and broadcast data into
  the `logdensity(flat_params, batch_indices)` that `samplers.SGLD` / `samplers.SGHMC`
  expect (`log prior + N / B * minibatch log-likelihood`); `sample_posterior` runs them with
  `samplers.run` and hands back the draws as models (`PosteriorDraws`).

`predict` averages the predictions of either kind of ensemble.

Example:
    >>> import jax, jax.numpy as jnp, equinox as eqx, optax, samplers
    >>> from samplers import ensembles
    >>> x = jnp.linspace(-1.0, 1.0, 32)[:, None]
    >>> data = (x, jnp.sin(3 * x))
    >>> make = lambda key: eqx.nn.MLP(1, 1, 8, 1, activation=jax.nn.tanh, key=key)
    >>> mse = lambda model, batch: jnp.mean((jax.vmap(model)(batch[0]) - batch[1]) ** 2)
    >>> optimizer = optax.adam(1e-2)
    >>> ensemble = ensembles.init_ensemble(make, optimizer, jax.random.key(0), 4)
    >>> ensemble, losses = ensembles.fit(ensemble, data, optimizer, mse, num_steps=50)
    >>> losses.shape, bool((losses[:, -1] < losses[:, 0]).all())
    ((4, 50), True)
    >>> ensembles.predict(ensemble, x).shape
    (32, 1)
"""

from ._posterior import MinibatchPosterior, PosteriorDraws, sample_posterior
from ._predict import predict
from ._training import DeepEnsemble, fit, init_ensemble, train_step

__all__ = [
    "DeepEnsemble",
    "MinibatchPosterior",
    "PosteriorDraws",
    "fit",
    "init_ensemble",
    "predict",
    "sample_posterior",
    "train_step",
]
