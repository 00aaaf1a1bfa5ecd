"""The bad-input catalogue: every mistake gets a clear EnsembleError naming what is wrong,
never a raw JAX/KeyError or a C++ abort, and the user's inputs are left unchanged."""

import copy

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers

N, D = 8, 3


def gaussian(x):
    return -0.5 * jnp.sum(x**2)


class Walkers(eqx.Module):
    x: jax.Array = enn.per_chain()
    scale: jax.Array = enn.broadcast()


def run(**overrides):
    kwargs = dict(
        sampler=samplers.MALA(step_size=0.5),
        logdensity=gaussian,
        positions=jnp.zeros((N, D)),
        key=jax.random.key(0),
        num_steps=5,
        progress=False,
    )
    kwargs.update(overrides)
    sampler, logdensity, positions = (kwargs.pop(k) for k in ("sampler", "logdensity", "positions"))
    return samplers.run(sampler, logdensity, positions, **kwargs)


def map_identity(*args, in_roles=enn.PER_CHAIN, **kwargs):
    return enn.ensemble_map(lambda *a: a, in_roles=in_roles, **kwargs)(*args)


# (name, callable raising, expected error type, regex the message must match, inputs to check)
X_WRONG = Walkers(jnp.zeros((N, 2)), jnp.ones(2))
X_SHORT = {"a": np.zeros((N, 2)), "b": np.zeros((N - 2,))}
NAN_POSITIONS = np.zeros((N, D), np.float32)
NAN_POSITIONS[3, 1] = np.nan
BAD_KEY = jax.random.split(jax.random.PRNGKey(0), 2)

CASES = [
    (
        "per-chain leaves with different leading sizes",
        lambda: map_identity(X_SHORT),
        enn.ChainCountError,
        r"(?s)\['a'\].*\['b'\]",
        X_SHORT,
    ),
    (
        "chains not divisible by devices",
        lambda: map_identity(jnp.zeros((10, 2))),
        enn.ChainCountError,
        r"10 chains.*4 devices",
        None,
    ),
    (
        "NaN initial position",
        lambda: run(positions=NAN_POSITIONS),
        enn.EnsembleError,
        r"non-finite.*chains \[3\]",
        NAN_POSITIONS,
    ),
    (
        "inf initial position",
        lambda: run(positions=jnp.full((N, D), jnp.inf)),
        enn.EnsembleError,
        "non-finite",
        None,
    ),
    (
        "logdensity returns a vector",
        lambda: run(logdensity=lambda x: -0.5 * x**2),
        enn.EnsembleError,
        r"scalar.*returns \(3,\)",
        None,
    ),
    (
        "logdensity NaN everywhere",
        lambda: run(logdensity=lambda x: jnp.nan * x.sum()),
        enn.EnsembleError,
        "not finite .* at any initial position",
        None,
    ),
    (
        "wrong mesh axis name",
        lambda: map_identity(
            jnp.zeros((N, 2)), axis="walkers", mesh=jax.make_mesh((4,), ("chains",))
        ),
        enn.MeshError,
        r"no axis named 'walkers'",
        None,
    ),
    ("role on a static field", lambda: enn.per_chain(static=True), enn.RoleError, "static", None),
    (
        "per-chain role on a Python number",
        lambda: enn.partition(
            type("Bad", (eqx.Module,), {"__annotations__": {"r": float}, "r": enn.per_chain()})(0.5)
        ),
        enn.RoleError,
        r"\.r .*not an array",
        None,
    ),
    (
        "negative step size",
        lambda: samplers.MALA(step_size=-0.1),
        enn.EnsembleError,
        r"MALA\.step_size must be positive",
        None,
    ),
    (
        "zero step size",
        lambda: samplers.HMC(step_size=0.0, num_integration_steps=5),
        enn.EnsembleError,
        r"HMC\.step_size must be positive",
        None,
    ),
    (
        "integer positions (dtype)",
        lambda: run(positions=jnp.zeros((N, D), jnp.int32)),
        enn.EnsembleError,
        "floating point",
        None,
    ),
    (
        "old-style key of the wrong shape",
        lambda: run(key=BAD_KEY),
        enn.EnsembleError,
        r"one PRNG key.*uint32\[2, 2\]",
        BAD_KEY,
    ),
    (
        "chain_keys with a key array",
        lambda: enn.chain_keys(BAD_KEY, 4),
        enn.EnsembleError,
        "key",
        BAD_KEY,
    ),
    (
        "non-callable logdensity",
        lambda: run(logdensity=np.ones(3)),
        enn.EnsembleError,
        "logdensity must be callable",
        None,
    ),
    ("num_steps 0", lambda: run(num_steps=0), enn.EnsembleError, "num_steps must be an int", None),
    (
        "num_steps negative",
        lambda: run(num_steps=-3),
        enn.EnsembleError,
        "num_steps must be an int",
        None,
    ),
    (
        "num_warmup negative",
        lambda: run(num_warmup=-1),
        enn.EnsembleError,
        "num_warmup must be an int",
        None,
    ),
    (
        "not a sampler",
        lambda: run(sampler="mala"),
        enn.EnsembleError,
        "sampler must be a samplers.Sampler",
        None,
    ),
    (
        "positions of the wrong rank",
        lambda: run(positions=jnp.zeros(N)),
        enn.EnsembleError,
        r"shape \(num_chains, dim\)",
        None,
    ),
    ("thin larger than num_steps", lambda: run(thin=50), enn.EnsembleError, "thin", None),
    (
        "in_roles given a PartitionSpec",
        lambda: map_identity(jnp.zeros((N, 2)), in_roles=jax.sharding.PartitionSpec("chains")),
        enn.RoleError,
        "PartitionSpec",
        None,
    ),
    (
        "in_roles of the wrong structure",
        lambda: map_identity(jnp.zeros((N, 2)), jnp.ones(2), in_roles=(enn.PER_CHAIN,)),
        enn.RoleError,
        "does not match",
        None,
    ),
    (
        "untagged array in strict mode",
        lambda: enn.ensemble_map(lambda w: w, strict=True)(X_WRONG, jnp.ones(3)),
        enn.RoleError,
        r"args\[1\].*no role",
        X_WRONG,
    ),
    (
        "scalar per-chain leaf",
        lambda: map_identity(jnp.float32(2.0)),
        enn.ChainCountError,
        "scalar",
        None,
    ),
    (
        "no per-chain input at all",
        lambda: enn.ensemble_map(lambda w: w)(jnp.ones(3)),
        enn.ChainCountError,
        "no per-chain input",
        None,
    ),
    (
        "collective outside ensemble_map",
        lambda: enn.chain_mean(jnp.ones(3)),
        enn.CollectiveError,
        "outside",
        None,
    ),
    (
        "broadcast output that varies",
        lambda: enn.ensemble_map(lambda x: x, in_roles=enn.PER_CHAIN, out_roles=enn.BROADCAST)(
            jnp.zeros(N)
        ),
        enn.OutputRoleError,
        "differs from chain to chain",
        None,
    ),
    (
        "bad closures option",
        lambda: enn.ensemble_map(lambda x: x, closures="maybe"),
        enn.EnsembleError,
        "closures",
        None,
    ),
    (
        "superchains that do not divide the chains",
        lambda: run(superchain_size=3),
        enn.EnsembleError,
        "superchain",
        None,
    ),
]


@pytest.mark.parametrize("name,call,error,pattern,inputs", CASES, ids=[c[0] for c in CASES])
def test_mistake_gets_a_clear_error(name, call, error, pattern, inputs):
    before = copy.deepcopy(jax.tree.map(np.asarray, inputs)) if inputs is not None else None
    with pytest.raises(error, match=pattern) as info:
        call()
    assert isinstance(info.value, enn.EnsembleError) and isinstance(info.value, ValueError)
    if inputs is not None:
        for a, b in zip(jax.tree.leaves(inputs), jax.tree.leaves(before), strict=True):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=f"{name}: input changed")


def test_the_catalogue_is_large_and_distinct():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)
