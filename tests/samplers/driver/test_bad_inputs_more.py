"""The bad-input catalogue, continued: kernel and adaptation constructors, `samplers.run`
options and log densities, and the `enn` entry points. Each mistake raises the library's
own class (a `TypeError` subclass for a wrong type, a `ValueError` one for a wrong value)
naming the argument, before anything is compiled, and leaves the inputs unchanged."""

import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ensemblenn as enn
import samplers
from tests.compile_counter import counting

N, D = 8, 3
POSITIONS = np.zeros((N, D), np.float32)  # numpy: the catalogue checks it is not mutated
KEY = jax.random.key(0)
# run's first act converts the numpy positions (a one-off tiny program): done here, so
# the compile count of each case sees only what that case compiles.
jnp.asarray(POSITIONS).block_until_ready()
MESH = jax.make_mesh((4,), ("chains",))
IMM_LONG = np.ones(5, np.float32)
IMM_MATRIX = np.ones((2, 2), np.float32)
PER_CHAIN_SHORT = enn.PerChainValue(np.full(N - 2, 0.1, np.float32))
X8 = np.zeros(N, np.float32)
T, V = TypeError, ValueError  # what each case's class must also be


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


def run(**overrides):
    kwargs = dict(
        sampler=samplers.MALA(step_size=0.5),
        logdensity=gaussian,
        positions=POSITIONS,
        key=KEY,
        num_steps=5,
        progress=False,
    )
    kwargs.update(overrides)
    sampler, logdensity, positions = (kwargs.pop(k) for k in ("sampler", "logdensity", "positions"))
    return samplers.run(sampler, logdensity, positions, **kwargs)


def branches(x):
    return -x[0] if x[0] > 0 else x[0]  # Python `if` on a traced value


def minibatch(x, idx):
    return -0.5 * jnp.sum(x**2)


SE, STE = samplers.SamplerError, samplers.SamplerTypeError
EE, ETE = enn.EnsembleError, enn.EnsembleTypeError

# (name, call, error class, also T or V, message regex, input that must not change)
KERNELS = [
    (
        "MALA step_size str",
        lambda: samplers.MALA(step_size="big"),
        STE,
        T,
        r"MALA\.step_size.*'big' \(str\)",
        None,
    ),  # noqa: E501
    (
        "MALA step_size bool",
        lambda: samplers.MALA(step_size=True),
        STE,
        T,
        r"MALA\.step_size.*True \(bool\)",
        None,
    ),  # noqa: E501
    (
        "MALA step_size list of str",
        lambda: samplers.MALA(step_size=["a"]),
        STE,
        T,
        r"MALA\.step_size",
        None,
    ),  # noqa: E501
    (
        "MALA step_size inf",
        lambda: samplers.MALA(step_size=math.inf),
        SE,
        V,
        r"MALA\.step_size must be finite, got inf",
        None,
    ),  # noqa: E501
    (
        "MALA step_size nan",
        lambda: samplers.MALA(step_size=math.nan),
        SE,
        V,
        r"MALA\.step_size must be finite, got nan",
        None,
    ),  # noqa: E501
    (
        "MALA step_size -inf",
        lambda: samplers.MALA(step_size=-math.inf),
        SE,
        V,
        r"MALA\.step_size must be finite",
        None,
    ),  # noqa: E501
    (
        "MALA step_size array with 0",
        lambda: samplers.MALA(step_size=jnp.array([0.1, 0.0, 0.2])),
        SE,
        V,
        r"MALA\.step_size must be positive",
        None,
    ),  # noqa: E501
    (
        "MALA per-chain step with a negative",
        lambda: samplers.MALA(step_size=enn.PerChainValue(jnp.array([0.1, -0.1]))),
        SE,
        V,
        r"MALA\.step_size must be positive",
        None,
    ),  # noqa: E501
    (
        "MALA per-chain step str",
        lambda: samplers.MALA(step_size=enn.PerChainValue(np.array(["a", "b"]))),
        T,
        T,
        r"PerChainValue",
        None,
    ),  # noqa: E501
    (
        "HMC num_integration_steps 2.5",
        lambda: samplers.HMC(0.1, num_integration_steps=2.5),
        SE,
        V,
        r"HMC\.num_integration_steps must be a whole number, got 2\.5",
        None,
    ),  # noqa: E501
    (
        "HMC num_integration_steps 0",
        lambda: samplers.HMC(0.1, num_integration_steps=0),
        SE,
        V,
        r"HMC\.num_integration_steps must be positive",
        None,
    ),  # noqa: E501
    (
        "HMC num_integration_steps -3",
        lambda: samplers.HMC(0.1, num_integration_steps=-3),
        SE,
        V,
        r"HMC\.num_integration_steps must be positive",
        None,
    ),  # noqa: E501
    (
        "HMC num_integration_steps inf",
        lambda: samplers.HMC(0.1, num_integration_steps=math.inf),
        SE,
        V,
        r"HMC\.num_integration_steps must be finite",
        None,
    ),  # noqa: E501
    (
        "HMC num_integration_steps str",
        lambda: samplers.HMC(0.1, num_integration_steps="10"),
        STE,
        T,
        r"HMC\.num_integration_steps",
        None,
    ),  # noqa: E501
    (
        "HMC step_size inf",
        lambda: samplers.HMC(math.inf, 5),
        SE,
        V,
        r"HMC\.step_size must be finite",
        None,
    ),  # noqa: E501
    (
        "HMC mass matrix negative",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix=-jnp.ones(3)),
        SE,
        V,
        r"HMC\.inverse_mass_matrix must be positive",
        None,
    ),  # noqa: E501
    (
        "HMC mass matrix zero entry",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix=jnp.array([1.0, 0.0, 1.0])),
        SE,
        V,
        r"HMC\.inverse_mass_matrix must be positive",
        None,
    ),  # noqa: E501
    (
        "HMC mass matrix NaN",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix=jnp.array([1.0, jnp.nan, 1.0])),
        SE,
        V,
        r"HMC\.inverse_mass_matrix must be finite",
        None,
    ),  # noqa: E501
    (
        "HMC mass matrix inf",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix=math.inf),
        SE,
        V,
        r"HMC\.inverse_mass_matrix must be finite",
        None,
    ),  # noqa: E501
    (
        "HMC dense mass matrix negative diagonal",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix=-jnp.eye(3)),
        SE,
        V,
        r"HMC\.inverse_mass_matrix must be positive",
        None,
    ),  # noqa: E501
    (
        "HMC mass matrix str",
        lambda: samplers.HMC(0.1, 5, inverse_mass_matrix="diag"),
        STE,
        T,
        r"HMC\.inverse_mass_matrix",
        None,
    ),  # noqa: E501
    (
        "GHMC neither persistence nor damping",
        lambda: samplers.GHMC(0.1),
        SE,
        V,
        "exactly one of momentum_persistence",
        None,
    ),  # noqa: E501
    (
        "GHMC both persistence and damping",
        lambda: samplers.GHMC(0.1, momentum_persistence=0.9, damping=1.0),
        SE,
        V,
        "exactly one",
        None,
    ),  # noqa: E501
    (
        "GHMC persistence above 1",
        lambda: samplers.GHMC(0.1, momentum_persistence=1.5),
        SE,
        V,
        r"GHMC\.momentum_persistence must be <= 1",
        None,
    ),  # noqa: E501
    (
        "GHMC persistence negative",
        lambda: samplers.GHMC(0.1, momentum_persistence=-0.1),
        SE,
        V,
        r"GHMC\.momentum_persistence must be >= 0",
        None,
    ),  # noqa: E501
    (
        "GHMC persistence nan",
        lambda: samplers.GHMC(0.1, momentum_persistence=math.nan),
        SE,
        V,
        r"GHMC\.momentum_persistence must be finite",
        None,
    ),  # noqa: E501
    (
        "GHMC persistence str",
        lambda: samplers.GHMC(0.1, momentum_persistence="high"),
        STE,
        T,
        r"GHMC\.momentum_persistence",
        None,
    ),  # noqa: E501
    (
        "GHMC damping negative",
        lambda: samplers.GHMC(0.1, damping=-1.0),
        SE,
        V,
        r"GHMC\.damping must be >= 0",
        None,
    ),  # noqa: E501
    (
        "GHMC step_size 0",
        lambda: samplers.GHMC(0.0, momentum_persistence=0.9),
        SE,
        V,
        r"GHMC\.step_size must be positive",
        None,
    ),  # noqa: E501
    ("MCLMC L 0", lambda: samplers.MCLMC(0.1, L=0.0), SE, V, r"MCLMC\.L must be positive", None),  # noqa: E501
    (
        "MCLMC L negative",
        lambda: samplers.MCLMC(0.1, L=-1.0),
        SE,
        V,
        r"MCLMC\.L must be positive",
        None,
    ),  # noqa: E501
    (
        "MCLMC L nan",
        lambda: samplers.MCLMC(0.1, L=math.nan),
        SE,
        V,
        r"MCLMC\.L must be positive",
        None,
    ),  # noqa: E501
    (
        "MCLMC step_size nan",
        lambda: samplers.MCLMC(math.nan, L=1.0),
        SE,
        V,
        r"MCLMC\.step_size must be finite",
        None,
    ),  # noqa: E501
    (
        "AdjustedMCLMC steps 1.5",
        lambda: samplers.AdjustedMCLMC(0.1, num_integration_steps=1.5),
        SE,
        V,
        r"AdjustedMCLMC\.num_integration_steps must be a whole number",
        None,
    ),  # noqa: E501
    (
        "AdjustedMCLMC step_size 0",
        lambda: samplers.AdjustedMCLMC(0.0, num_integration_steps=3),
        SE,
        V,
        r"AdjustedMCLMC\.step_size must be positive",
        None,
    ),  # noqa: E501
    (
        "SGLD batch_size 0",
        lambda: samplers.SGLD(0.1, batch_size=0, num_data=10),
        SE,
        V,
        r"SGLD\.batch_size must be positive",
        None,
    ),  # noqa: E501
    (
        "SGLD batch_size 2.5",
        lambda: samplers.SGLD(0.1, batch_size=2.5, num_data=10),
        STE,
        T,
        r"SGLD\.batch_size must be a Python int, got 2\.5",
        None,
    ),  # noqa: E501
    (
        "SGLD batch_size larger than data without replacement",
        lambda: samplers.SGLD(0.1, batch_size=20, num_data=10, replace=False),
        SE,
        V,
        r"SGLD\.batch_size=20 exceeds num_data=10",
        None,
    ),  # noqa: E501
    (
        "SGLD num_data 0",
        lambda: samplers.SGLD(0.1, batch_size=2, num_data=0),
        SE,
        V,
        r"SGLD\.num_data must be >= 1",
        None,
    ),  # noqa: E501
    (
        "SGLD num_data float",
        lambda: samplers.SGLD(0.1, batch_size=2, num_data=10.0),
        STE,
        T,
        r"SGLD\.num_data must be a Python int",
        None,
    ),  # noqa: E501
    (
        "SGLD temperature negative",
        lambda: samplers.SGLD(0.1, batch_size=2, num_data=10, temperature=-1.0),
        SE,
        V,
        r"SGLD\.temperature must be >= 0",
        None,
    ),  # noqa: E501
    (
        "SGHMC friction above 1",
        lambda: samplers.SGHMC(0.1, batch_size=2, num_data=10, friction=2.0),
        SE,
        V,
        r"SGHMC\.friction must be <= 1",
        None,
    ),  # noqa: E501
    (
        "SGHMC friction 0",
        lambda: samplers.SGHMC(0.1, batch_size=2, num_data=10, friction=0.0),
        SE,
        V,
        r"SGHMC\.friction must be positive",
        None,
    ),  # noqa: E501
    ("Stretch a 1", lambda: samplers.Stretch(a=1.0), SE, V, r"Stretch needs a > 1", None),
    ("Stretch a 0.5", lambda: samplers.Stretch(a=0.5), SE, V, r"Stretch needs a > 1", None),
    (
        "Stretch a inf",
        lambda: samplers.Stretch(a=math.inf),
        SE,
        V,
        r"Stretch\.a must be finite",
        None,
    ),  # noqa: E501
    ("Stretch a str", lambda: samplers.Stretch(a="2"), STE, T, r"Stretch\.a .*'2' \(str\)", None),  # noqa: E501
    (
        "DifferentialEvolution gamma negative",
        lambda: samplers.DifferentialEvolution(gamma=-1.0),
        SE,
        V,
        r"DifferentialEvolution.*gamma",
        None,
    ),  # noqa: E501
    (
        "DifferentialEvolution sigma negative",
        lambda: samplers.DifferentialEvolution(sigma=-1e-3),
        SE,
        V,
        r"DifferentialEvolution.*sigma",
        None,
    ),  # noqa: E501
    (
        "DifferentialEvolution gamma nan",
        lambda: samplers.DifferentialEvolution(gamma=math.nan),
        SE,
        V,
        r"DifferentialEvolution.*gamma",
        None,
    ),  # noqa: E501
    (
        "RandomWalk step_size 0",
        lambda: samplers.RandomWalk(0.0),
        SE,
        V,
        r"RandomWalk\.step_size must be positive",
        None,
    ),  # noqa: E501
    (
        "RandomWalk step_size str",
        lambda: samplers.RandomWalk("x"),
        STE,
        T,
        r"RandomWalk\.step_size",
        None,
    ),  # noqa: E501
    (
        "RandomWalk step_size inf",
        lambda: samplers.RandomWalk(math.inf),
        SE,
        V,
        r"RandomWalk\.step_size must be finite",
        None,
    ),  # noqa: E501
    (
        "NUTS max_tree_depth 0",
        lambda: samplers.NUTS(0.1, max_tree_depth=0),
        SE,
        V,
        r"NUTS\.max_tree_depth must be between 1 and",
        None,
    ),  # noqa: E501
    (
        "NUTS max_tree_depth 31",
        lambda: samplers.NUTS(0.1, max_tree_depth=31),
        SE,
        V,
        r"NUTS\.max_tree_depth must be between 1 and",
        None,
    ),  # noqa: E501
    (
        "NUTS max_tree_depth float",
        lambda: samplers.NUTS(0.1, max_tree_depth=10.0),
        STE,
        T,
        r"NUTS\.max_tree_depth must be a Python int",
        None,
    ),  # noqa: E501
    (
        "NUTS step_size nan",
        lambda: samplers.NUTS(math.nan),
        SE,
        V,
        r"NUTS\.step_size must be finite",
        None,
    ),  # noqa: E501
    (
        "NUTS mass matrix negative",
        lambda: samplers.NUTS(0.1, inverse_mass_matrix=-1.0),
        SE,
        V,
        r"NUTS\.inverse_mass_matrix must be positive",
        None,
    ),  # noqa: E501
]

ADAPTATION = [
    (
        "LAPS num_steps1 0",
        lambda: samplers.LAPS(num_steps1=0),
        SE,
        V,
        r"LAPS: num_steps1 must be an int >= 1",
        None,
    ),  # noqa: E501
    (
        "LAPS num_steps1 float",
        lambda: samplers.LAPS(num_steps1=100.0),
        STE,
        T,
        r"LAPS: num_steps1 must be an int",
        None,
    ),  # noqa: E501
    (
        "LAPS num_adaptation_steps -1",
        lambda: samplers.LAPS(num_adaptation_steps=-1),
        SE,
        V,
        r"LAPS: num_adaptation_steps",
        None,
    ),  # noqa: E501
    (
        "LAPS superchain_size 0",
        lambda: samplers.LAPS(superchain_size=0),
        SE,
        V,
        r"LAPS: superchain_size",
        None,
    ),  # noqa: E501
    (
        "LAPS save_frac 1.5",
        lambda: samplers.LAPS(save_frac=1.5),
        SE,
        V,
        r"LAPS: save_frac must be \(0, 1\]",
        None,
    ),  # noqa: E501
    ("LAPS save_frac 0", lambda: samplers.LAPS(save_frac=0.0), SE, V, r"LAPS: save_frac", None),
    (
        "LAPS alpha negative",
        lambda: samplers.LAPS(alpha=-1.0),
        SE,
        V,
        r"LAPS: alpha must be > 0",
        None,
    ),  # noqa: E501
    ("LAPS C nan", lambda: samplers.LAPS(C=math.nan), SE, V, r"LAPS: C must be > 0", None),
    ("LAPS r_end 0", lambda: samplers.LAPS(r_end=0.0), SE, V, r"LAPS: r_end must be > 0", None),
    (
        "LAPS initial_step_size inf",
        lambda: samplers.LAPS(initial_step_size=math.inf),
        SE,
        V,
        r"LAPS: initial_step_size",
        None,
    ),  # noqa: E501
    (
        "LAPS target_acceptance 1.2",
        lambda: samplers.LAPS(target_acceptance=1.2),
        SE,
        V,
        r"LAPS: target_acceptance must be \(0, 1\)",
        None,
    ),  # noqa: E501
    (
        "LAPS alpha str",
        lambda: samplers.LAPS(alpha="x"),
        STE,
        T,
        r"LAPS: alpha must be a number",
        None,
    ),  # noqa: E501
    (
        "LAPS early_stop int",
        lambda: samplers.LAPS(early_stop=1),
        STE,
        T,
        r"LAPS: early_stop must be True or False",
        None,
    ),  # noqa: E501
    (
        "LAPS unknown integrator",
        lambda: samplers.LAPS(integrator="rk4"),
        SE,
        V,
        r"LAPS: integrator must be one of",
        None,
    ),  # noqa: E501
    (
        "LAPS unknown burn-in integrator",
        lambda: samplers.LAPS(burn_in_integrator="euler"),
        SE,
        V,
        r"LAPS: burn_in_integrator",
        None,
    ),  # noqa: E501
    (
        "LAPS given a sampler",
        lambda: run(sampler=samplers.MALA(0.5), adaptation=samplers.LAPS(num_steps1=10)),
        EE,
        V,
        r"LAPS builds its own kernels",
        POSITIONS,
    ),  # noqa: E501
    ("ChEES num_steps 0", lambda: samplers.ChEES(num_steps=0), EE, V, r"ChEES num_steps", None),
]

RUN = [
    (
        "run chunk_size 2.5",
        lambda: run(chunk_size=2.5),
        STE,
        T,
        r"chunk_size must be None or an int >= 1, got 2\.5",
        POSITIONS,
    ),  # noqa: E501
    ("run chunk_size -1", lambda: run(chunk_size=-1), SE, V, r"chunk_size .* got -1", POSITIONS),  # noqa: E501
    ("run chunk_size 0", lambda: run(chunk_size=0), SE, V, r"chunk_size .* got 0", None),
    (
        "run superchain_size 2.0",
        lambda: run(superchain_size=2.0),
        STE,
        T,
        r"superchain_size .* got 2\.0",
        POSITIONS,
    ),  # noqa: E501
    (
        "run superchain_size -1",
        lambda: run(superchain_size=-1),
        SE,
        V,
        r"superchain_size .* got -1",
        None,
    ),  # noqa: E501
    (
        "run superchain_size 5 of 8 chains",
        lambda: run(superchain_size=5),
        SE,
        V,
        r"superchain_size=5 does not divide the 8 chains",
        POSITIONS,
    ),  # noqa: E501
    (
        "run reference str",
        lambda: run(reference="exact"),
        STE,
        T,
        r"reference must be None or a samplers\.targets\.Moments.*'exact'",
        None,
    ),  # noqa: E501
    (
        "run thin above num_steps",
        lambda: run(thin=6),
        SE,
        V,
        r"thin must be None or an int in \[0, num_steps=5\], got 6",
        None,
    ),  # noqa: E501
    ("run thin 2.0", lambda: run(thin=2.0), STE, T, r"thin .* got 2\.0", None),
    ("run thin negative", lambda: run(thin=-2), SE, V, r"thin .* got -2", None),
    (
        "run num_warmup -5",
        lambda: run(num_warmup=-5),
        SE,
        V,
        r"num_warmup must be an int >= 0, got -5",
        POSITIONS,
    ),  # noqa: E501
    ("run num_warmup 2.5", lambda: run(num_warmup=2.5), STE, T, r"num_warmup must be an int", None),  # noqa: E501
    ("run num_steps 2.5", lambda: run(num_steps=2.5), STE, T, r"num_steps must be an int", None),
    ("run num_steps str", lambda: run(num_steps="100"), STE, T, r"num_steps must be an int", None),  # noqa: E501
    (
        "run checkpoint_every 0",
        lambda: run(checkpoint_every=0),
        SE,
        V,
        r"checkpoint_every .* got 0",
        None,
    ),  # noqa: E501
    (
        "run checkpoint_every 1.5",
        lambda: run(checkpoint_every=1.5),
        STE,
        T,
        r"checkpoint_every .* got 1\.5",
        None,
    ),  # noqa: E501
    (
        "run progress str",
        lambda: run(progress="yes"),
        STE,
        T,
        r"progress must be True, False or None.*'yes'",
        None,
    ),  # noqa: E501
    ("run resume str", lambda: run(resume="yes"), STE, T, r"resume must be True or False", None),  # noqa: E501
    (
        "run track_bias str",
        lambda: run(track_bias="yes"),
        STE,
        T,
        r"track_bias must be True or False",
        None,
    ),  # noqa: E501
    ("run block_size 0", lambda: run(block_size=0), SE, V, r"block_size must be .* got 0", None),
    (
        "run block_size str",
        lambda: run(block_size="big"),
        STE,
        T,
        r"block_size must be .*'big'",
        None,
    ),  # noqa: E501
    (
        "run block_size 2.0",
        lambda: run(block_size=2.0),
        STE,
        T,
        r"block_size must be .* 2\.0",
        None,
    ),  # noqa: E501
    (
        "run mesh str",
        lambda: run(mesh="mesh"),
        STE,
        T,
        r"mesh must be None or a jax\.sharding\.Mesh.*'mesh' \(str\)",
        None,
    ),  # noqa: E501
    (
        "run mesh a device list",
        lambda: run(mesh=jax.devices()),
        STE,
        T,
        r"mesh must be None or a jax\.sharding\.Mesh",
        None,
    ),  # noqa: E501
    (
        "run axis missing from the mesh",
        lambda: run(mesh=MESH, axis="walkers"),
        enn.MeshError,
        V,
        r"no axis named 'walkers'",
        POSITIONS,
    ),  # noqa: E501
    (
        "run axis not a str",
        lambda: run(axis=0),
        STE,
        T,
        r"axis must be the name of the mesh axis",
        None,
    ),  # noqa: E501
    (
        "run adaptation not an Adaptation",
        lambda: run(adaptation="laps"),
        STE,
        T,
        r"adaptation must be a samplers\.Adaptation",
        None,
    ),  # noqa: E501
    ("run key an int", lambda: run(key=0), EE, T, r"key", None),
    ("run key a float array", lambda: run(key=np.zeros(2, np.float32)), EE, T, r"key", None),
    (
        "logdensity returns an int",
        lambda: run(logdensity=lambda x: jnp.sum(x).astype(jnp.int32)),
        STE,
        T,
        r"logdensity must return a real floating-point scalar.*int32",
        POSITIONS,
    ),  # noqa: E501
    (
        "logdensity returns a complex number",
        lambda: run(logdensity=lambda x: jnp.sum(x) * 1j),
        STE,
        T,
        r"logdensity must return a real floating-point scalar.*complex64",
        None,
    ),  # noqa: E501
    (
        "logdensity returns a bool",
        lambda: run(logdensity=lambda x: jnp.all(x > 0)),
        STE,
        T,
        r"logdensity must return a real floating-point scalar.*bool",
        None,
    ),  # noqa: E501
    (
        "logdensity returns a Python float",
        lambda: run(logdensity=lambda x: 0.0),
        STE,
        T,
        r"logdensity must return a JAX array.*float",
        None,
    ),  # noqa: E501
    (
        "logdensity calls float() on a tracer",
        lambda: run(logdensity=lambda x: float(jnp.sum(x))),
        STE,
        T,
        r"logdensity cannot be traced by JAX.*ConcretizationTypeError",
        None,
    ),  # noqa: E501
    (
        "logdensity branches on a tracer",
        lambda: run(logdensity=branches),
        STE,
        T,
        r"(?s)logdensity cannot be traced by JAX.*jnp\.where",
        None,
    ),  # noqa: E501
    (
        "logdensity returns one term per coordinate",
        lambda: run(logdensity=lambda x: -0.5 * x**2),
        SE,
        V,
        r"logdensity must return a scalar .* returns \(3,\)",
        None,
    ),  # noqa: E501
    (
        "logdensity returns a matrix",
        lambda: run(logdensity=lambda x: jnp.outer(x, x)),
        SE,
        V,
        r"returns \(3, 3\)",
        None,
    ),  # noqa: E501
    (
        "logdensity returns a tuple",
        lambda: run(logdensity=lambda x: (jnp.sum(x), 0.0)),
        SE,
        V,
        r"logdensity must return a scalar .* tuple",
        None,
    ),  # noqa: E501
    # An exception of the log density's own is no mistake of the call: it propagates as
    # itself, with a note (tests/samplers/driver/test_raw_errors.py).
    (
        "minibatch logdensity given to MALA",
        lambda: run(logdensity=minibatch),
        None,
        None,
        None,
        None,
    ),  # noqa: E501 - not caught here: see test below
    (
        "HMC mass matrix of the wrong length",
        lambda: run(sampler=samplers.HMC(0.1, 3, inverse_mass_matrix=IMM_LONG)),
        SE,
        V,
        r"HMC\.inverse_mass_matrix has shape \(5,\), but the positions have dim 3",
        IMM_LONG,
    ),  # noqa: E501
    (
        "HMC dense mass matrix of the wrong size",
        lambda: run(sampler=samplers.HMC(0.1, 3, inverse_mass_matrix=IMM_MATRIX)),
        SE,
        V,
        r"HMC\.inverse_mass_matrix has shape \(2, 2\)",
        IMM_MATRIX,
    ),  # noqa: E501
    (
        "MALA step_size vector of the wrong length",
        lambda: run(sampler=samplers.MALA(np.ones(4, np.float32))),
        SE,
        V,
        r"MALA\.step_size has shape \(4,\)",
        None,
    ),  # noqa: E501
    (
        "MALA per-chain step of the wrong chain count",
        lambda: run(sampler=samplers.MALA(PER_CHAIN_SHORT)),
        SE,
        V,
        r"MALA\.step_size is an enn\.PerChainValue of shape \(6,\), but there are 8 chains",
        None,
    ),  # noqa: E501
    (
        "MALA schedule of the wrong shape",
        lambda: run(sampler=samplers.MALA(lambda c: jnp.full(5, 0.1))),
        SE,
        V,
        r"MALA\.step_size has shape \(5,\) \(the schedule's value\)",
        None,
    ),  # noqa: E501
    (
        "Stretch a vector",
        lambda: run(sampler=samplers.Stretch(a=np.full(3, 2.0, np.float32))),
        SE,
        V,
        r"(?s)Stretch\.a has shape \(3,\).*shape \(\)",
        None,
    ),  # noqa: E501
    (
        "NUTS mass matrix of the wrong length",
        lambda: run(sampler=samplers.NUTS(0.1, inverse_mass_matrix=IMM_LONG)),
        SE,
        V,
        r"NUTS\.inverse_mass_matrix has shape \(5,\)",
        IMM_LONG,
    ),  # noqa: E501
    (
        "GHMC optax schedule persistence of wrong shape",
        lambda: run(
            sampler=samplers.GHMC(
                0.1, momentum_persistence=optax.constant_schedule(np.full(2, 0.5, np.float32))
            )
        ),
        SE,
        V,
        r"GHMC\.momentum_persistence has shape \(2,\)",
        None,
    ),  # noqa: E501
]
RUN = [c for c in RUN if c[2] is not None]

ENN = [
    (
        "combine with mismatched structures",
        lambda: enn.combine({"a": 1}, {"b": 2}),
        EE,
        V,
        r"combine\(operands, static\).*\['a'\].*\['b'\]",
        None,
    ),  # noqa: E501
    (
        "combine with extra static leaves",
        lambda: enn.combine({"a": X8}, {"a": None, "b": 2}),
        EE,
        V,
        r"only in static: \[\"\['b'\]\"\]",
        X8,
    ),  # noqa: E501
    (
        "combine tuple against list",
        lambda: enn.combine((1, 2), [1, 2]),
        EE,
        V,
        r"different node types",
        None,
    ),  # noqa: E501
    (
        "partition in_roles a str",
        lambda: enn.partition(X8, in_roles="per_chain"),
        enn.RoleError,
        V,
        r"in_roles .* 'per_chain'",
        X8,
    ),  # noqa: E501
    (
        "partition in_roles an int",
        lambda: enn.partition(X8, in_roles=1),
        enn.RoleError,
        V,
        r"in_roles",
        None,
    ),  # noqa: E501
    (
        "partition axis not a str",
        lambda: enn.partition(X8, axis=0),
        ETE,
        T,
        r"axis must be a mesh axis name",
        None,
    ),  # noqa: E501
    (
        "partition strict not a bool",
        lambda: enn.partition(X8, strict="yes"),
        ETE,
        T,
        r"strict must be True or False",
        None,
    ),  # noqa: E501
    (
        "ensemble_map mesh a str",
        lambda: enn.ensemble_map(lambda x: x, mesh="cpu"),
        enn.MeshError,
        T,
        r"mesh must be a jax\.sharding\.Mesh, got 'cpu'",
        None,
    ),  # noqa: E501
    (
        "ensemble_map axis not in the mesh",
        lambda: enn.ensemble_map(lambda x: x, mesh=MESH, axis="walkers", in_roles=enn.PER_CHAIN)(
            X8
        ),
        enn.MeshError,
        V,
        r"no axis named 'walkers'",
        None,
    ),  # noqa: E501
    (
        "ensemble_map axis not a str",
        lambda: enn.ensemble_map(lambda x: x, axis=1),
        ETE,
        T,
        r"axis must be the name of a mesh axis",
        None,
    ),  # noqa: E501
    (
        "ensemble_map closures not lift/error",
        lambda: enn.ensemble_map(lambda x: x, closures="capture"),
        EE,
        V,
        r"closures must be 'lift' or 'error', got 'capture'",
        None,
    ),  # noqa: E501
    (
        "ensemble_map closures a bool",
        lambda: enn.ensemble_map(lambda x: x, closures=True),
        ETE,
        T,
        r"closures must be 'lift' or 'error' \(a str\)",
        None,
    ),  # noqa: E501
    (
        "ensemble_map strict not a bool",
        lambda: enn.ensemble_map(lambda x: x, strict=1),
        ETE,
        T,
        r"strict must be True or False",
        None,
    ),  # noqa: E501
    (
        "ensemble_map block_size 0",
        lambda: enn.ensemble_map(lambda x: x, block_size=0),
        EE,
        V,
        r"block_size=0",
        None,
    ),  # noqa: E501
    (
        "ensemble_map block_size float",
        lambda: enn.ensemble_map(lambda x: x, block_size=2.5),
        ETE,
        T,
        r"block_size=2\.5",
        None,
    ),  # noqa: E501
    (
        "ensemble_map block_size str",
        lambda: enn.ensemble_map(lambda x: x, block_size="big"),
        ETE,
        T,
        r"block_size='big'",
        None,
    ),  # noqa: E501
    (
        "ensemble_map fn not callable",
        lambda: enn.ensemble_map(3),
        ETE,
        T,
        r"ensemble_map needs a callable.*int",
        None,
    ),  # noqa: E501
    (
        "chain_keys num_chains 0",
        lambda: enn.chain_keys(KEY, 0),
        EE,
        V,
        r"num_chains must be a positive int, got 0",
        None,
    ),  # noqa: E501
    (
        "chain_keys num_chains 2.5",
        lambda: enn.chain_keys(KEY, 2.5),
        ETE,
        T,
        r"num_chains must be a positive int, got 2\.5",
        None,
    ),  # noqa: E501
    (
        "chain_keys num_chains bool",
        lambda: enn.chain_keys(KEY, True),
        ETE,
        T,
        r"num_chains .* True",
        None,
    ),  # noqa: E501
    (
        "chain_keys key an int",
        lambda: enn.chain_keys(0, 4),
        ETE,
        T,
        r"chain_keys expects a typed key",
        None,
    ),  # noqa: E501
    (
        "chain_keys key a float array",
        lambda: enn.chain_keys(X8, 4),
        ETE,
        T,
        r"chain_keys expects a typed key .*float32\[8\]",
        X8,
    ),  # noqa: E501
    (
        "PerChainValue of a str",
        lambda: enn.PerChainValue("x"),
        ETE,
        T,
        r"PerChainValue\.value must be an array.*'x' \(str\)",
        None,
    ),  # noqa: E501
    (
        "PerChainValue of a scalar",
        lambda: enn.PerChainValue(0.5),
        EE,
        V,
        r"PerChainValue\.value is a scalar",
        None,
    ),  # noqa: E501
    (
        "PerChainValue of a list of numbers",
        lambda: enn.PerChainValue([0.1, 0.2]),
        EE,
        V,
        r"PerChainValue\.value\[0\] is a scalar",
        None,
    ),  # noqa: E501
    (
        "per_chain on a static field",
        lambda: enn.per_chain(static=True),
        enn.RoleError,
        V,
        r"static",
        None,
    ),  # noqa: E501
    (
        "broadcast on a static field",
        lambda: enn.broadcast(static=True),
        enn.RoleError,
        V,
        r"static",
        None,
    ),  # noqa: E501
    (
        "chain_sum outside ensemble_map",
        lambda: enn.chain_sum(X8),
        enn.CollectiveError,
        V,
        r"chain_sum\(\) was called outside",
        X8,
    ),  # noqa: E501
    (
        "chain_index outside ensemble_map",
        lambda: enn.chain_index(),
        enn.CollectiveError,
        V,
        r"outside",
        None,
    ),  # noqa: E501
    (
        "num_chains outside ensemble_map",
        lambda: enn.num_chains(),
        enn.CollectiveError,
        V,
        r"outside",
        None,
    ),  # noqa: E501
    (
        "chain_all_gather outside ensemble_map",
        lambda: enn.chain_all_gather(X8),
        enn.CollectiveError,
        V,
        r"outside",
        None,
    ),  # noqa: E501
]

CASES = KERNELS + ADAPTATION + RUN + ENN
RUN_NAMES = {c[0] for c in RUN}


def _snapshot(inputs):
    return copy.deepcopy(jax.tree.map(np.asarray, inputs))


@pytest.mark.parametrize("name,call,error,kind,pattern,inputs", CASES, ids=[c[0] for c in CASES])
def test_mistake_gets_a_clear_error_before_compiling(name, call, error, kind, pattern, inputs):
    before = _snapshot(inputs) if inputs is not None else None
    with counting() as compiles:
        with pytest.raises(error, match=pattern) as info:
            call()
    assert isinstance(info.value, enn.EnsembleError), f"{name}: not the library's own class"
    assert isinstance(info.value, kind), f"{name}: expected a {kind.__name__}"
    if name in RUN_NAMES:  # (the other cases build their own inputs, which may compile)
        assert len(compiles) == 0, f"{name}: compiled {compiles.names} before raising"
    if inputs is not None:
        for a, b in zip(jax.tree.leaves(inputs), jax.tree.leaves(before), strict=True):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{name}: input changed")


def test_the_catalogue_is_large_and_distinct():
    from test_bad_inputs import CASES as FIRST

    names = [c[0] for c in FIRST] + [c[0] for c in CASES]
    assert len(names) >= 100 and len(set(names)) == len(names)


def test_valid_edges_are_accepted():
    # The rules must not refuse what is legitimate: the edges of each range.
    samplers.GHMC(0.1, momentum_persistence=0.0)  # alpha = 0 is MALA
    samplers.GHMC(0.1, momentum_persistence=1.0)
    samplers.GHMC(0.1, damping=0.0)
    samplers.MCLMC(0.1, L=math.inf)  # no momentum noise, as LAPS starts
    samplers.HMC(0.1, num_integration_steps=jnp.float32(4.0))  # a whole number
    samplers.HMC(0.1, 5, inverse_mass_matrix=jnp.eye(3) + 0.1)
    samplers.SGLD(0.1, batch_size=10, num_data=10, replace=False, temperature=0.0)
    samplers.MALA(enn.PerChainValue(jnp.full(N, 0.1)))
    samplers.MALA(optax.linear_schedule(0.1, 0.01, 10))
    samplers.LAPS(save_frac=1.0, target_acceptance=0.9, integrator="omelyan")
    samplers.HMC(0.1, 3, inverse_mass_matrix=jnp.ones(D)).check_dim(D, N)
    samplers.MALA(enn.PerChainValue(jnp.full(N, 0.1))).check_dim(D, N)


def test_hyperparameter_checks_apply_to_subclasses():
    class Scaled(samplers.RandomWalk):
        scale: float = samplers.hyperparameter(positive=True, integer=True, default=1.0)

    with pytest.raises(samplers.SamplerError, match=r"Scaled\.scale must be a whole number"):
        Scaled(0.5, scale=1.5)
    with pytest.raises(samplers.SamplerTypeError, match=r"Scaled\.step_size"):
        Scaled("big")


def test_traced_hyperparameters_are_left_to_their_users():
    # Under jit the values are unknown: construction must not fail (or concretise them).
    @jax.jit
    def build(step):
        return samplers.MALA(step).step_size * 2

    assert float(build(0.25)) == 0.5
