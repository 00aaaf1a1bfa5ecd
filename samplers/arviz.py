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


_INTEGER_STATS = ("n_steps", "tree_depth")


def _draw_stats(host: dict) -> dict[str, np.ndarray]:
    """The per-draw sample statistics in ArviZ's names and types; those the kernel does not
    report (all -inf: `samplers.driver._chunk.ABSENT`) are left out."""
    stats = {}
    for name, value in (host["stats"] or {}).items():
        value = np.asarray(value)
        if value.size and np.all(value == -np.inf):
            continue
        if name == "diverging":
            value = value != 0
        elif name in _INTEGER_STATS:
            value = value.astype(np.int64)
        stats[name] = value
    if host["draw_lp"] is not None:
        stats["lp"] = np.asarray(host["draw_lp"])
    return stats


def _warmup_steps(result: Any) -> int:
    """The steps that ran before sampling: the adaptation's (when its info says how many)
    and `num_warmup`."""
    steps = int(getattr(result, "num_warmup", 0))
    adapted = getattr(getattr(result, "adaptation_info", None), "num_steps", None)
    if adapted is not None and np.size(adapted) == 1:
        steps += int(np.asarray(adapted))
    return steps


def _site_dims(target: Any, variables: dict) -> tuple[dict, dict]:
    """`(dims, coords)` of a NumPyro model's sites: an axis that a `numpyro.plate` indexes
    is named after the plate (coordinates `0..size-1`), the others `{name}_dim_{i}`."""
    from numpyro import handlers

    model = handlers.seed(target.model, 0)
    trace = handlers.trace(model).get_trace(*target.model_args, **target.model_kwargs)
    dims, coords = {}, {}
    for name, site in trace.items():
        if site["type"] not in ("sample", "deterministic"):
            continue
        shape = np.shape(site["value"])
        event = getattr(site.get("fn"), "event_dim", 0) if site["type"] == "sample" else 0
        names = [f"{name}_dim_{i}" for i in range(len(shape))]
        for frame in site.get("cond_indep_stack", ()):
            axis = len(shape) - event + frame.dim
            if 0 <= axis < len(shape) and shape[axis] == frame.size:
                names[axis] = frame.name
                coords[frame.name] = np.arange(frame.size)
        dims[name] = names
    return {k: v for k, v in dims.items() if k in variables or k in trace}, coords


def _log_likelihood(target: Any, posterior: dict) -> tuple[dict, dict]:
    """`(pointwise log likelihood of each observed site per draw, observed data)`."""
    from numpyro.infer.util import log_likelihood

    latent = {name: posterior[name] for name in target.shapes if name in posterior}
    pointwise = log_likelihood(
        target.model, latent, *target.model_args, batch_ndims=2, **target.model_kwargs
    )
    from numpyro import handlers

    model = handlers.seed(target.model, 0)
    trace = handlers.trace(model).get_trace(*target.model_args, **target.model_kwargs)
    observed = {
        name: np.asarray(site["value"])
        for name, site in trace.items()
        if site["type"] == "sample" and site.get("is_observed", False) and name in pointwise
    }
    return {k: np.asarray(v) for k, v in pointwise.items()}, observed


def _named_dataset(variables: dict, coords: dict, dims: dict, attrs: dict) -> Any:
    """An xarray Dataset whose variables have `(chain, draw, *dims[name])` dims."""
    import xarray as xr

    data, used = {}, dict(coords)
    for name, value in variables.items():
        extra = list(dims.get(name, ()))
        extra += [f"{name}_dim_{i}" for i in range(len(extra), value.ndim - len(coords))]
        data[name] = ((*coords, *extra[: value.ndim - len(coords)]), value)
    return xr.Dataset(data, coords=used, attrs=dict(attrs))


def _data_dataset(variables: dict, dims: dict, coords: dict, attrs: dict) -> Any:
    """An xarray Dataset of arrays without chain and draw (the observed data)."""
    import xarray as xr

    data = {}
    for name, value in variables.items():
        names = list(dims.get(name, ()))[: value.ndim]
        names += [f"{name}_dim_{i}" for i in range(len(names), value.ndim)]
        data[name] = (tuple(names), value)
    used = {k: v for k, v in coords.items() if any(k in d for d, _ in data.values())}
    return xr.Dataset(data, coords=used, attrs=dict(attrs))


def to_arviz(result: Any, *, var_name: str = "x", superchain_size: int | None = None) -> Any:
    """The kept draws of a `samplers.run` result as ArviZ data: an `arviz.InferenceData`
    (ArviZ 0.x) or an `xarray.DataTree` (ArviZ 1.x), with the same groups.

    Groups:

    * `posterior`: one variable per leaf of `result.trace` (the target's observable, else
      the position), named by its path (`mu`, `theta_z`, `params.w`), with dims
      `(chain, draw, {name}_dim_0, ...)`; a plain array trace is the variable `var_name`.
      For a `samplers.targets.from_numpyro` target these are the constrained sites and
      the deterministic ones, and an axis a `numpyro.plate` indexes is named after the
      plate (coordinates `0..size-1`). When the run had superchains (or
      `superchain_size` is given) it also carries the coordinate `superchain` on `chain`
      (chain `i` is in superchain `i // superchain_size`, consecutive chains, as
      `samplers.diagnostics.nested_rhat` groups them) and the attribute
      `superchain_size`.
    * `sample_stats`: per draw (dims `(chain, draw)`), in ArviZ's names, what the kernel
      reports: `diverging`, `acceptance_rate`, `n_steps` (gradient evaluations),
      `step_size`, `energy_error`, `tree_depth` (NUTS), `energy` (kernels whose info
      has the Hamiltonian), and `lp`, the log density of the draw (on the chains'
      scale); per chain (dim `chain`): `mean_acceptance_rate`, `num_divergent`,
      `num_grads`.
    * `log_likelihood` and `observed_data` (NumPyro models with observed sites): the
      pointwise log likelihood of each observation per draw, for `az.loo`/`az.waic`.

    Attributes of the groups record the run's `num_warmup` (the warmup and adaptation
    steps that ran before sampling), `num_steps` and sampler.

    Args:
        result: a `samplers.Result` of a run that kept a trace (any `thin` but 0).
        var_name: the posterior variable's name when the trace is one plain array.
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
        >>> sorted(idata.sample_stats.data_vars)  # doctest: +NORMALIZE_WHITESPACE
        ['acceptance_rate', 'diverging', 'energy_error', 'lp', 'mean_acceptance_rate',
         'n_steps', 'num_divergent', 'num_grads', 'step_size']
    """
    if getattr(result, "trace", None) is None:
        raise enn.EnsembleError(
            "This result has no trace to export: the run kept no draws (thin=0).\n  fix: "
            "run without thin (every draw that fits the memory budget) or with thin=k "
            "(every k-th draw), then call result.to_arviz()."
        )
    az = _import_arviz()

    host = enn.distributed.gather(
        {
            "trace": result.trace,
            "stats": getattr(result, "sample_stats", None),
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
        "num_warmup": _warmup_steps(result),
        "num_steps": int(getattr(result, "num_steps", 0)),
        "sampler": type(sampler).__name__ if sampler is not None else "None",
        "exported_by": "samplers.arviz.to_arviz",
    }
    if size is not None:
        attrs["superchain_size"] = int(size)
    coords = {"chain": np.arange(num_chains), "draw": np.arange(num_draws)}
    target = getattr(result, "target", None)
    dims, site_coords = _site_dims(target, variables) if target is not None else ({}, {})
    posterior = _named_dataset(variables, coords, dims, attrs).assign_coords(
        {k: v for k, v in site_coords.items() if k in _used_dims(variables, dims)}
    )
    per_chain = {
        "mean_acceptance_rate": host["acceptance"],
        "num_divergent": host["divergent"],
        "num_grads": host["grads"],
    }
    per_draw = _draw_stats(host)
    if "lp" not in per_draw and host["lp"] is not None:
        per_chain["lp"] = host["lp"]  # no per-draw value (a minibatch log density)
    sample_stats = _dataset(per_draw, coords, attrs).merge(
        _dataset(per_chain, {"chain": coords["chain"]}, attrs)
    )
    sample_stats.attrs = dict(attrs)
    groups = {"posterior": posterior, "sample_stats": sample_stats}
    if target is not None:
        pointwise, observed = _log_likelihood(target, variables)
        if pointwise:
            groups["log_likelihood"] = _named_dataset(pointwise, coords, dims, attrs)
            groups["log_likelihood"] = groups["log_likelihood"].assign_coords(
                {k: v for k, v in site_coords.items() if k in _used_dims(pointwise, dims)}
            )
            groups["observed_data"] = _data_dataset(observed, dims, site_coords, attrs)
    if size is not None:
        superchain = ("chain", np.arange(num_chains) // size)
        for name in ("posterior", "sample_stats", "log_likelihood"):
            if name in groups:
                groups[name] = groups[name].assign_coords(superchain=superchain)
    return _inference_data(az, groups)


def _used_dims(variables: dict, dims: dict) -> set:
    return {d for name in variables for d in dims.get(name, ())}
