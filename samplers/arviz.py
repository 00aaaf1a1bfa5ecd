"""Export a run to ArviZ: `Result.to_arviz()` / `samplers.arviz.to_arviz(result)`.

ArviZ is optional (`pip install arviz`); nothing here imports it until it is called.

Example:
    >>> import jax, jax.numpy as jnp, samplers
    >>> target = samplers.targets.IllConditionedGaussian(dim=2, condition_number=2.0)
    >>> result = samplers.run(samplers.MALA(step_size=0.5), target, jnp.zeros((8, 2)),
    ...                       key=jax.random.key(0), num_steps=40, thin=4, progress=False,
    ...                       superchain_size=4)
    >>> idata = result.to_arviz()
    >>> dict(idata.posterior["x"].sizes)
    {'chain': 8, 'draw': 10, 'x_dim_0': 2}
    >>> idata.posterior["superchain"].values.tolist()
    [0, 0, 0, 0, 1, 1, 1, 1]
"""

from typing import Any

import numpy as np

import ensemblenn as enn

__all__ = ["to_arviz"]


def _import_arviz() -> Any:
    try:
        import arviz
    except ImportError:
        raise ImportError(
            "Result.to_arviz needs ArviZ, which is not installed.\n  fix: pip install arviz "
            "(or install this package with its 'dev' extra)."
        ) from None
    return arviz


def _is_arviz_1(az: Any) -> bool:
    return int(az.__version__.split(".")[0]) >= 1


def _dataset(az: Any, data: dict, *, coords: dict, attrs: dict) -> Any:
    """`az.dict_to_dataset` without an inference-library tag; the keyword was renamed in 1.0."""
    tag = {"inference_library": None} if _is_arviz_1(az) else {"library": None}
    return az.dict_to_dataset(data, coords=coords, attrs=attrs, **tag)


def _inference_data(az: Any, **groups: Any) -> Any:
    """The groups as ArviZ's container: `InferenceData` before 1.0, an `xarray.DataTree`
    (which replaced it, with the same `.posterior` group access) from 1.0 on."""
    if _is_arviz_1(az):
        import xarray as xr

        return xr.DataTree.from_dict(groups)
    return az.InferenceData(**groups)


def to_arviz(result: Any, *, var_name: str = "x", superchain_size: int | None = None) -> Any:
    """The thinned trace of a `samplers.run` result as ArviZ data: an `arviz.InferenceData`
    (ArviZ 0.x) or an `xarray.DataTree` (ArviZ 1.x), with the same groups.

    Groups:

    * `posterior`: `var_name` with dims `(chain, draw, {var_name}_dim_0)`, from
      `result.trace`. When the run had superchains (or `superchain_size` is given) it also
      carries the coordinate `superchain` on `chain` (chain `i` is in superchain
      `i // superchain_size`, consecutive chains, as `samplers.diagnostics.nested_rhat`
      groups them) and the attribute `superchain_size`.
    * `sample_stats`: what the run keeps per chain (dim `chain` only, since the driver keeps
      no per-draw statistics): `mean_acceptance_rate`, `num_divergent`, `num_grads`, and
      `lp`, the log density at the final state. No `energy`: the driver does not record it.

    Attributes of both groups record the run's `num_warmup`, `num_steps` and sampler.

    Args:
        result: a `samplers.Result` of a run with `thin=` (which keeps a trace).
        var_name: the posterior variable's name.
        superchain_size: overrides the run's superchain size for the `superchain` coordinate.

    Raises:
        ImportError: ArviZ is not installed.
        enn.EnsembleError: the run kept no trace, or the superchain size does not divide
            the chains.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((4, 2)), key=jax.random.key(0), num_steps=20,
        ...                       thin=5, progress=False)
        >>> idata = samplers.arviz.to_arviz(result, var_name="theta", superchain_size=2)
        >>> dict(idata.posterior["theta"].sizes), idata.posterior["superchain"].values.tolist()
        ({'chain': 4, 'draw': 4, 'theta_dim_0': 2}, [0, 0, 1, 1])
        >>> sorted(idata.sample_stats.data_vars)
        ['lp', 'mean_acceptance_rate', 'num_divergent', 'num_grads']
    """
    if getattr(result, "trace", None) is None:
        raise enn.EnsembleError(
            "This result has no trace to export: samplers.run keeps only streaming moments "
            "unless asked.\n  fix: run with thin=k (keep every k-th draw), e.g. "
            "samplers.run(..., thin=10), then call result.to_arviz()."
        )
    az = _import_arviz()
    from . import distributed

    host = distributed.gather(
        {
            "trace": result.trace,
            "acceptance": result.acceptance_rate,
            "divergent": result.num_divergent,
            "grads": result.num_grads,
            "lp": getattr(result.state, "logdensity", None),
        }
    )
    trace = host["trace"]
    num_chains, num_draws = trace.shape[:2]
    size = (
        superchain_size if superchain_size is not None else getattr(result, "superchain_size", None)
    )
    if size is not None and (
        isinstance(size, bool) or not isinstance(size, int) or size < 1 or num_chains % size
    ):
        raise enn.EnsembleError(
            f"superchain_size must be a positive int dividing the {num_chains} chains, got "
            f"{size!r}."
        )
    sampler = getattr(result, "sampler", None)
    attrs = {
        "num_warmup": int(getattr(result, "num_warmup", 0)),
        "num_steps": int(getattr(result, "num_steps", 0)),
        "sampler": type(sampler).__name__ if sampler is not None else "None",
        "exported_by": "samplers.arviz.to_arviz",
    }
    if size is not None:
        attrs["superchain_size"] = int(size)
    coords = {"chain": np.arange(num_chains), "draw": np.arange(num_draws)}
    posterior = _dataset(az, {var_name: trace}, coords=coords, attrs=attrs)
    if size is not None:
        posterior = posterior.assign_coords(superchain=("chain", np.arange(num_chains) // size))
    stats = {
        "mean_acceptance_rate": host["acceptance"],
        "num_divergent": host["divergent"],
        "num_grads": host["grads"],
    }
    if host["lp"] is not None:
        stats["lp"] = host["lp"]
    import xarray as xr  # an ArviZ dependency

    sample_stats = xr.Dataset(
        {name: (("chain",), np.asarray(value)) for name, value in stats.items()},
        coords={"chain": coords["chain"]},
        attrs=dict(posterior.attrs),
    )
    if size is not None:
        sample_stats = sample_stats.assign_coords(
            superchain=("chain", np.arange(num_chains) // size)
        )
    return _inference_data(az, posterior=posterior, sample_stats=sample_stats)
