"""What `SMC` checks before anything compiles: its fields, and `SMC.run`'s arguments."""

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn

from .._errors import SamplerError, SamplerTypeError
from ..kernels import Sampler
from ._particles import Particles
from ._resampling import SCHEMES


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_fields(smc: Any) -> None:
    """`SMC`'s hyperparameters (called by `SMC.__check_init__`)."""
    name = type(smc).__name__
    if not isinstance(smc.kernel, Sampler):
        raise SamplerTypeError(
            f"{name}.kernel must be a samplers.Sampler (the mutation kernel), got "
            f"{type(smc.kernel).__name__}.\n  fix: {name}(samplers.MALA(step_size=0.5)), or "
            "any kernel of samplers (RandomWalk, HMC, NUTS, MCLMC, ...)."
        )
    if not _is_int(smc.num_mutation_steps) or smc.num_mutation_steps < 1:
        error = SamplerError if _is_int(smc.num_mutation_steps) else SamplerTypeError
        raise error(
            f"{name}.num_mutation_steps must be an int >= 1, got {smc.num_mutation_steps!r}."
            "\n  fix: num_mutation_steps=10 (more for a kernel that moves little per step)."
        )
    if not _is_real(smc.target_ess) or not 0.0 < smc.target_ess < 1.0:
        error = SamplerError if _is_real(smc.target_ess) else SamplerTypeError
        raise error(
            f"{name}.target_ess must be a fraction in (0, 1), got {smc.target_ess!r}.\n  fix: "
            "target_ess=0.5 (the ESS each stage's reweighting keeps, as a fraction of N)."
        )
    if smc.resampling not in SCHEMES:
        raise SamplerError(
            f"{name}.resampling must be one of {', '.join(map(repr, SCHEMES))}, got "
            f'{smc.resampling!r}.\n  fix: resampling="systematic" (the default).'
        )
    if smc.metric not in ("diagonal", "dense", None):
        raise SamplerError(
            f"{name}.metric must be 'diagonal', 'dense' or None, got {smc.metric!r}.\n  fix: "
            "metric=\"diagonal\" (the particles' variances), or None to leave the kernel's."
        )
    target = smc.target_acceptance
    if target is not None and (not _is_real(target) or not 0.0 < target < 1.0):
        raise (SamplerError if _is_real(target) else SamplerTypeError)(
            f"{name}.target_acceptance must be None or in (0, 1), got {target!r}.\n  fix: "
            "target_acceptance=None (the kernel's default) or e.g. 0.65."
        )
    if not _is_int(smc.max_stages) or smc.max_stages < 1:
        raise (SamplerError if _is_int(smc.max_stages) else SamplerTypeError)(
            f"{name}.max_stages must be an int >= 1, got {smc.max_stages!r}.\n  fix: "
            "max_stages=1000."
        )
    check_schedule(name, smc.schedule)
    check_decorrelation(name, smc)
    check_waste_free(name, smc)


def check_decorrelation(name: str, smc: Any) -> None:
    target = smc.decorrelation
    if target is not None and (not _is_real(target) or not 0.0 < target < 1.0):
        raise (SamplerError if _is_real(target) else SamplerTypeError)(
            f"{name}.decorrelation must be None or in (0, 1), got {target!r}.\n  fix: "
            "decorrelation=None (num_mutation_steps per stage) or e.g. 0.1."
        )
    most = smc.max_mutation_steps
    if not _is_int(most) or most < smc.num_mutation_steps:
        raise (SamplerError if _is_int(most) else SamplerTypeError)(
            f"{name}.max_mutation_steps must be an int >= num_mutation_steps "
            f"({smc.num_mutation_steps}), got {most!r}.\n  fix: max_mutation_steps=100."
        )


def check_waste_free(name: str, smc: Any) -> None:
    length = smc.waste_free
    if length is None:
        return
    if not _is_int(length) or length < 2:
        raise (SamplerError if _is_int(length) else SamplerTypeError)(
            f"{name}.waste_free must be None or an int >= 2 (the states of each chain), got "
            f"{length!r}.\n  fix: waste_free=None (resample-move), or e.g. waste_free=8 "
            "(a divisor of the number of particles)."
        )
    if smc.decorrelation is not None:
        raise SamplerError(
            f"{name}.waste_free={length} cannot be combined with "
            f"decorrelation={smc.decorrelation!r}: waste-free chains have a fixed length.\n"
            "  fix: decorrelation=None (a longer waste_free for better-mixed particles), or "
            "waste_free=None."
        )


def check_waste_free_run(smc: Any, num_particles: int, mesh: Any, axis: str) -> int:
    """The number of waste-free chains, `M = N / P`, checked against `N` and the mesh."""
    name, length = type(smc).__name__, smc.waste_free
    if num_particles % length:
        divisors = [p for p in range(2, min(num_particles, 64) + 1) if num_particles % p == 0]
        some = f"waste_free={divisors[-1]} (a divisor), or " if divisors else ""
        raise SamplerError(
            f"SMC.run: {name}.waste_free={length} must divide the number of particles, "
            f"{num_particles}.\n  fix: {some}{(num_particles // length + 1) * length} "
            "particles."
        )
    chains = num_particles // length
    mesh = enn.resolve_mesh(mesh, axis)
    devices = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))[axis]
    if chains % devices:
        raise SamplerError(
            f"SMC.run: {name}.waste_free={length} leaves {chains} chains (= {num_particles} "
            f"particles / {length}), which cannot be split evenly over the {devices} devices "
            f"of mesh axis {axis!r}.\n  fix: a waste_free that leaves a multiple of {devices} "
            f"chains, or {length * devices * (chains // devices + 1)} particles."
        )
    return chains


def check_schedule(name: str, schedule: Any) -> None:
    if schedule is None:
        return
    try:
        values = np.asarray(schedule, np.float64)
    except (TypeError, ValueError):
        values = None
    if values is None or values.ndim != 1 or not values.size:
        raise SamplerTypeError(
            f"{name}.schedule must be None or a sequence of temperatures, got {schedule!r}."
            "\n  fix: schedule=None (adaptive), or e.g. schedule=[0.01, 0.1, 0.5, 1.0]."
        )
    ok = np.all(np.isfinite(values)) and np.all(values > 0) and np.all(np.diff(values) > 0)
    if not ok or values[-1] != 1.0:
        raise SamplerError(
            f"{name}.schedule must increase strictly within (0, 1] and end at 1, got "
            f"{list(values)}.\n  fix: e.g. schedule=[0.01, 0.1, 0.5, 1.0] (0, the prior, is "
            "implied)."
        )


def split_target(target: Any) -> tuple[Any, Any]:
    """`(target.log_prior, target.log_likelihood)` of a target passed alone."""
    parts = getattr(target, "log_prior", None), getattr(target, "log_likelihood", None)
    if not all(callable(p) for p in parts):
        raise SamplerTypeError(
            f"SMC.run: with log_likelihood=None, the first argument must be a target with "
            f"log_prior and log_likelihood methods, got {type(target).__name__}.\n  fix: "
            "SMC.run(log_prior, log_likelihood, particles, key=...), or a target of "
            "samplers.targets.from_numpyro(model, ...)."
        )
    return parts


def check_callable(argument: str, fn: Any) -> None:
    if not callable(fn):
        raise SamplerTypeError(
            f"SMC.run: {argument} must be a callable of ONE particle's pytree, got "
            f"{type(fn).__name__}.\n  fix: {argument}=lambda x: ..., or "
            f"target.{argument} of samplers.targets.from_numpyro(model, ...)."
        )


def check_density(argument: str, fn: Any, structure: Particles) -> None:
    """`fn` must map one particle to a real scalar (traced, not compiled)."""
    shapes = jax.tree.map(lambda s: s.shape, structure.one())
    try:
        out = jax.eval_shape(fn, structure.one())
    except Exception as err:
        err.add_note(
            f"SMC.run: raised by {argument}, called on ONE particle (shapes {shapes}; traced, "
            "before anything compiles).\n  fix: it takes one particle, the structure of "
            "particles without the leading particle axis."
        )
        raise
    if not hasattr(out, "shape") or out.shape != () or not jnp.issubdtype(out.dtype, jnp.floating):
        found = getattr(out, "shape", type(out).__name__), getattr(out, "dtype", None)
        raise SamplerError(
            f"SMC.run: {argument} must return a real floating scalar for ONE particle of "
            f"shapes {shapes}, but returns shape {found[0]} dtype {found[1]}.\n  fix: sum the "
            "terms, e.g. return jnp.sum(log_terms); SMC maps it over the particles itself."
        )


def check_not_traced(particles: Any, key: Any) -> None:
    """SMC's stages are a host loop (the next temperature depends on the last stage's
    values), which a `jax.jit` trace cannot run."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((particles, key))):
        raise SamplerTypeError(
            "SMC.run was called on traced values (inside jax.jit, vmap or grad): its stages "
            "are a loop on the host, whose temperatures depend on each stage's results.\n"
            "  fix: call SMC.run outside jax.jit; each stage is compiled by itself."
        )


def check_key(key: Any) -> None:
    typed = isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if typed and key.shape == ():
        return
    if isinstance(key, jax.Array | np.ndarray) and key.dtype == np.uint32 and key.shape == (2,):
        return
    raise SamplerTypeError(
        f"SMC.run: key must be one PRNG key, got {type(key).__name__} "
        f"{getattr(key, 'shape', '')}.\n  fix: key=jax.random.key(0)."
    )


def check_particles(structure: Particles) -> None:
    if structure.num_particles < 2:
        raise SamplerError(
            f"SMC.run: particles has {structure.num_particles} particle(s) along its leading "
            "axis; resampling needs at least 2.\n  fix: pass hundreds of draws from the "
            "prior, shape (num_particles, ...)."
        )


def check_initial(log_prior: np.ndarray, log_likelihood: np.ndarray) -> None:
    """The values at the initial particles: a finite log prior (draws from the prior lie
    in its support) and a log likelihood that is not NaN or +inf."""
    bad = np.flatnonzero(~np.isfinite(log_prior))
    if bad.size:
        raise SamplerError(
            f"SMC.run: log_prior is {log_prior[bad[0]]} at particle {bad[0]} ({bad.size} of "
            f"{log_prior.size} particles non-finite).\n  fix: particles must be draws from "
            "the prior (inside its support), e.g. target.prior_particles(key, n) for a "
            "NumPyro model."
        )
    bad = np.flatnonzero(np.isnan(log_likelihood) | np.isposinf(log_likelihood))
    if bad.size:
        raise SamplerError(
            f"SMC.run: log_likelihood is {log_likelihood[bad[0]]} at particle {bad[0]} "
            f"({bad.size} of {log_likelihood.size} particles NaN or +inf).\n  fix: return a "
            "finite log likelihood (or -inf where the likelihood is zero) at every point of "
            "the prior's support."
        )
