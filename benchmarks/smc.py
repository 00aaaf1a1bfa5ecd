"""SMC: cross-device resampling per scheme, and samplers.SMC vs BlackJAX's tempered SMC.

Part `resampling`: `samplers.smc.resample` of `--particles` particles of `--floats` float32
each, inside one `enn.ensemble_map` body that resamples `--rounds` times in a
`lax.fori_loop` (the time per resampling excludes the call's fixed cost), per scheme; then,
in raw `jax.shard_map` (the framework has no public point-to-point collective), the same
systematic resampling two ways: every device all-gathers every particle (what `resample`
does), or a neighbour exchange (a `ppermute` of a fixed-size prefix and suffix of each
device's block, falling back to the all-gather when a device needs rows from further
away). The two raw rows return the same bits (checked). Timed in alternation, min and
median; `MB/dev` is what one device receives per resampling.
"""

import argparse
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
from samplers.smc import SCHEMES, ancestors, resample

from ._common import emit, mesh_for, print_machine
from .overhead import interleaved

BENCH = "smc"

COLUMNS = [
    ("part", "part", ""),
    ("impl", "impl", ""),
    ("devices", "dev", "d"),
    ("particles", "particles", "d"),
    ("dim", "floats", "d"),
    ("ms", "ms (min)", ".3f"),
    ("ms_median", "ms (median)", ".3f"),
    ("mb_received", "MB/dev", ".2f"),
    ("load", "load", ".1f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="resampling", help="comma-separated: resampling")
    p.add_argument("--particles", type=int, default=None, help="default 4096")
    p.add_argument("--floats", type=int, default=None, help="floats per particle (100)")
    p.add_argument("--rounds", type=int, default=None, help="resamplings per call (50)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timings (7)")


# --- resampling --------------------------------------------------------------------------


def _looped_resample(scheme: str, rounds: int, mesh: Any) -> Any:
    def body(key: Any, log_weight: Any, particle: Any) -> Any:
        def one(i: Any, p: Any) -> Any:
            return resample(jax.random.fold_in(key, i), log_weight, p, scheme=scheme)[0]

        return lax.fori_loop(0, rounds, one, particle)

    return enn.ensemble_map(body, mesh=mesh, in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN))


def _raw(kind: str, rounds: int, mesh: Any, n: int, caps: tuple[int, ...]) -> Any:
    """Systematic resampling at the device level (no vmap), by all-gather or neighbours."""
    devices = mesh.shape["chains"]
    local = n // devices

    def step(key: Any, lw: Any, x: Any) -> tuple[Any, Any]:
        a = ancestors(key, lax.all_gather(lw, "chains", tiled=True))
        d = lax.axis_index("chains")
        mine = lax.dynamic_slice_in_dim(a, d * local, local)

        def gather_all(x: Any) -> Any:
            return lax.all_gather(x, "chains", tiled=True)[mine]

        if kind == "all_gather":
            return gather_all(x), jnp.int32(len(caps))
        # The rows each device needs from its neighbours, known on every device.
        first, last, dev = a[::local], a[local - 1 :: local], jnp.arange(devices)
        near = ((first // local >= dev - 1) & (last // local <= dev + 1)).all()
        need = jnp.maximum(
            jnp.where(last // local > dev, last - (dev + 1) * local + 1, 0).max(),
            jnp.where(first // local < dev, dev * local - first, 0).max(),
        )
        src = mine // local
        own = x[jnp.clip(mine - d * local, 0, local - 1)]

        def exchange(c: int) -> Any:
            def go(x: Any) -> Any:
                up = [(j, j - 1) for j in range(1, devices)]
                down = [(j, j + 1) for j in range(devices - 1)]
                prefix = lax.ppermute(x[:c], "chains", up)  # from device d + 1
                suffix = lax.ppermute(x[local - c :], "chains", down)  # from d - 1
                p = prefix[jnp.clip(mine - (d + 1) * local, 0, c - 1)]
                s = suffix[jnp.clip(mine - (d * local - c), 0, c - 1)]
                out = jnp.where((src == d - 1)[:, None], s, own)
                return jnp.where((src == d + 1)[:, None], p, out)

            return go

        branch = jnp.where(near, jnp.searchsorted(jnp.asarray(caps), need), len(caps))
        return lax.switch(branch, [exchange(c) for c in caps] + [gather_all], x), branch

    def body(key: Any, lw: Any, x: Any) -> tuple[Any, Any]:
        def one(i: Any, carry: tuple) -> tuple:
            x, widest = carry
            x, branch = step(jax.random.fold_in(key, i), lw, x)
            return x, jnp.maximum(widest, branch)

        x, widest = lax.fori_loop(0, rounds, one, (x, jnp.int32(0)))
        return x, widest[None]

    spec = P("chains")
    return jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=(P(), spec, spec), out_specs=(spec, spec), check_vma=False
        )
    )


def resampling(args: argparse.Namespace, records: list[dict]) -> None:
    if args.smoke:
        n, dim, rounds, repeats = 64, 4, 3, 2
    else:
        n, dim, rounds, repeats = 4096, 100, 50, 7
    n, dim = args.particles or n, args.floats or dim
    rounds, repeats = args.rounds or rounds, args.repeats or repeats
    devices = args.num_devices
    mesh = mesh_for(devices)
    local = n // devices
    sharded = NamedSharding(mesh, P("chains"))
    x = jax.device_put(jax.random.normal(jax.random.key(args.seed), (n, dim)), sharded)
    # Log weights of an SMC stage (spread 1): a device needs a few rows of its neighbours.
    lw = jax.device_put(jax.random.normal(jax.random.key(args.seed + 1), (n,)), sharded)
    key = jax.random.key(args.seed + 2)
    caps = tuple(sorted({max(1, local // 16), max(1, local // 4)}))
    fns = {f"resample {s}": _looped_resample(s, rounds, mesh) for s in SCHEMES}
    fns["raw all_gather (systematic)"] = _raw("all_gather", rounds, mesh, n, caps)
    fns["raw neighbours (systematic)"] = _raw("neighbours", rounds, mesh, n, caps)
    raw_a, _ = fns["raw all_gather (systematic)"](key, lw, x)
    raw_n, widest = fns["raw neighbours (systematic)"](key, lw, x)
    same = bool(np.array_equal(np.asarray(raw_a), np.asarray(raw_n)))
    branch = int(np.asarray(widest).max())
    ours = np.asarray(fns["resample systematic"](key, lw, x))
    same_as_ours = bool(np.array_equal(ours, np.asarray(raw_a)))
    times = interleaved(fns, {name: (key, lw, x) for name in fns}, repeats, 1)
    row_bytes = 4 * dim
    gathered = (devices - 1) * local * (row_bytes + 4) / 1e6  # particles and log weights
    for name, (t_min, t_median) in times.items():
        received = gathered
        note = ""
        if name.startswith("raw neighbours"):
            if branch < len(caps):
                c = caps[branch]
                received = (2 * c * row_bytes + (devices - 1) * local * 4) / 1e6
                note = f"{c}-row prefix/suffix; same bits: {same}"
            else:
                note = f"fell back to all_gather; same bits: {same}"
        elif name.startswith("raw all_gather"):
            note = f"same bits as resample: {same_as_ours}"
        emit(
            {
                "benchmark": BENCH,
                "part": "resampling",
                "impl": name,
                "devices": devices,
                "particles": n,
                "dim": dim,
                "rounds": rounds,
                "ms": 1e3 * t_min / rounds,
                "ms_median": 1e3 * t_median / rounds,
                "mb_received": received * (devices > 1),
                "note": note,
                "load": os.getloadavg()[0],
            },
            records,
        )


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    records: list[dict] = []
    parts = set(args.parts.split(","))
    if "resampling" in parts:
        resampling(args, records)
    return records
