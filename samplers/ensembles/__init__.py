"""SG-MCMC posteriors of neural networks, sharded over devices.

`MinibatchPosterior` turns a model, a log-likelihood and broadcast data into the
`logdensity(flat_params, batch_indices)` that `samplers.SGLD` / `samplers.SGHMC` expect
(`log prior + N / B * minibatch log-likelihood`); `sample_posterior` runs them with
`samplers.run` (from scratch or from a trained deep ensemble) and hands back the draws as
models (`PosteriorDraws`); `predict` averages their predictions over chains and draws.

Deep ensembles, members trained by their own optimizers (no MCMC), are framework code:
`enn.init_ensemble`, `enn.train_step`, `enn.fit`, `enn.predict` and `enn.DeepEnsemble`.

Example:
    >>> import jax, jax.numpy as jnp, equinox as eqx, optax, ensemblenn as enn
    >>> from samplers import ensembles
    >>> x = jnp.linspace(-1.0, 1.0, 32)[:, None]
    >>> data = (x, jnp.sin(3 * x))
    >>> make = lambda key: eqx.nn.MLP(1, 1, 8, 1, activation=jax.nn.tanh, key=key)
    >>> mse = lambda model, batch: jnp.mean((jax.vmap(model)(batch[0]) - batch[1]) ** 2)
    >>> optimizer = optax.adam(1e-2)
    >>> ensemble = enn.init_ensemble(make, optimizer, jax.random.key(0), 4)
    >>> ensemble, losses = enn.fit(ensemble, data, optimizer, mse, num_steps=50)
    >>> losses.shape, bool((losses[:, -1] < losses[:, 0]).all())
    ((4, 50), True)
    >>> ensembles.predict(ensemble, x).shape
    (32, 1)
"""

from ._posterior import MinibatchPosterior, PosteriorDraws, sample_posterior
from ._predict import predict

__all__ = ["MinibatchPosterior", "PosteriorDraws", "predict", "sample_posterior"]
