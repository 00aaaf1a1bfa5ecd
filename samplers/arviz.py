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

import jax
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


def _variables(result: Any, trace: Any, var_name: str) -> dict[str, np.ndarray]:
    """One `(chain, draw, ...)` array per leaf of the trace, named by its path."""
    structure = getattr(result, "structure", None)
    leaves = jax.tree.leaves(trace)
    if (
        structure is None
        or structure.treedef.num_leaves != len(leaves)
        or (structure.treedef.num_leaves == 1 and structure.leaf_names == ("x",))
    ):
        names = [var_name] if len(leaves) == 1 else [f"{var_name}{i}" for i in range(len(leaves))]
    else:
        names = list(structure.leaf_names)
    return {name: np.asarray(leaf) for name, leaf in zip(names, leaves, strict=True)}


def _dataset(variables: dict, coords: dict, attrs: dict) -> Any:
    """An xarray Dataset with ArviZ's naming: dims `chain`, `draw`, then `{name}_dim_{i}`."""
    import xarray as xr  # an ArviZ dependency (0.x and 1.x)

    data = {}
    for name, value in variables.items():
        extra = tuple(f"{name}_dim_{i}" for i in range(value.ndim - len(coords)))
        data[name] = ((*coords, *extra)[: value.ndim], value)
    return xr.Dataset(data, coords={k: v for k, v in coords.items()}, attrs=dict(attrs))


def _inference_data(az: Any, groups: dict) -> Any:
    """ArviZ 0.x's `InferenceData`, or 1.x's `xarray.DataTree` of the same groups (1.x
    still has an `az.InferenceData` name, an alias of DataTree with another constructor)."""
    if int(az.__version__.split(".")[0]) < 1:
        return az.InferenceData(**groups)
    import xarray as xr

    return xr.DataTree.from_dict(groups)


def to_arviz(result: Any, *, var_name: str = "x", superchain_size: int | None = None) -> Any:
    """The thinned trace of a `samplers.run` result as ArviZ data: an `arviz.InferenceData`
    (ArviZ 0.x) or an `xarray.DataTree` (ArviZ 1.x), with the same groups.

    Groups:

    * `posterior`: one variable per leaf of `result.trace` (the target's observable, else
      the position), named by its path (`mu`, `theta_z`, `params.w`), with dims
      `(chain, draw, {name}_dim_0, ...)`; a plain array trace is the variable `var_name`.
      When the run had superchains (or `superchain_size` is given) it also carries the
      coordinate `superchain` on `chain` (chain `i` is in superchain
      `i // superchain_size`, consecutive chains, as `samplers.diagnostics.nested_rhat`
      groups them) and the attribute `superchain_size`.
    * `sample_stats`: `lp`, the log density of each kept draw (dims `(chain, draw)`; of
      the final state, dim `chain`, when the run could not evaluate it per draw), and what
      the run keeps per chain (dim `chain`): `mean_acceptance_rate`, `num_divergent`,
      `num_grads`. No `energy`: the driver does not record it.

    Attributes of both groups record the run's `num_warmup`, `num_steps` and sampler.

    Args:
        result: a `samplers.Result` of a run with `thin=` (which keeps a trace).
        var_name: the posterior variable's name when the trace is one plain array.
        superchain_size: overrides the run's superchain size for the `superchain` coordinate.

    Works with ArviZ 0.x (an `arviz.InferenceData`) and 1.x (an `xarray.DataTree` with the
    same groups).

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
            "draw_lp": getattr(result, "draw_logdensity", None),
        }
    )
    variables = _variables(result, host["trace"], var_name)
    num_chains, num_draws = next(iter(variables.values())).shape[:2]
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
    posterior = _dataset(variables, coords, attrs)
    per_chain = {
        "mean_acceptance_rate": host["acceptance"],
        "num_divergent": host["divergent"],
        "num_grads": host["grads"],
    }
    if host["draw_lp"] is not None:
        per_draw = {"lp": host["draw_lp"]}
    else:
        per_draw = {}
        if host["lp"] is not None:
            per_chain["lp"] = host["lp"]
    sample_stats = _dataset(per_draw, coords, attrs).merge(
        _dataset(per_chain, {"chain": coords["chain"]}, attrs)
    )
    sample_stats.attrs = dict(attrs)
    if size is not None:
        superchain = ("chain", np.arange(num_chains) // size)
        posterior = posterior.assign_coords(superchain=superchain)
        sample_stats = sample_stats.assign_coords(superchain=superchain)
    return _inference_data(az, {"posterior": posterior, "sample_stats": sample_stats})
