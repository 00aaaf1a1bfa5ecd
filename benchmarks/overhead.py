"""The framework's own cost: an MCLMC step through `enn.ensemble_map` vs hand-written shard_map.

The hand-written version is what a careful user would write without ensemblenn:
`jax.jit(jax.shard_map(jax.vmap(step), in_specs=(P(), P('chains'), P('chains')), ...))`
with the target passed as a replicated operand. Ours is
`enn.ensemble_map(step, in_roles=(None, None, PER_CHAIN, PER_CHAIN))` with the kernel and
target (broadcast fields) as arguments, called the way users call it: eagerly from Python
(so its per-call Python work, role resolution, placement checks and the cache lookup, is
included), and also under an outer `jax.jit` (the compiled program alone).

Two workloads: one step, and a `lax.scan` of K steps inside the per-chain function. Each is
timed as the minimum (and median) over interleaved repetitions, ours and hand-written
alternating, so machine load hits both alike. Goal: ours / hand-written <= 1.03.
"""

import argparse
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
import samplers

from ._common import emit, gaussian, logistic, mesh_for, print_machine

BENCH = "overhead"

COLUMNS = [
    ("workload", "workload", ""),
    ("target", "target", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("impl", "impl", ""),
    ("min_us", "min µs", ".1f"),
    ("median_us", "median µs", ".1f"),
    ("ratio_min", "ratio (min)", ".3f"),
    ("ratio_median", "ratio (median)", ".3f"),
    ("hlo_instructions", "HLO instr.", "d"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="default 512 (--full 8192)")
    p.add_argument("--steps", type=int, default=None, help="K of the scan (default 100)")
    p.add_argument("--repeats", type=int, default=None, help="timings per variant")
    p.add_argument("--target", default="gauss100", choices=("gauss100", "logreg50"))


def interleaved(
    fns: dict[str, Any], args: dict[str, tuple], repeats: int, number: int
) -> dict[str, tuple[float, float]]:
    """(min, median) seconds per call of each function, timed in alternation."""
    import time

    for name, fn in fns.items():
        jax.block_until_ready(fn(*args[name]))  # compile and warm up
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            fn, a = fns[name], args[name]
            t0 = time.perf_counter()
            for _ in range(number):
                out = fn(*a)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / number)
    return {n: (min(t), sorted(t)[len(t) // 2]) for n, t in times.items()}


def hlo_size(compiled: Any) -> int:
    return sum(1 for line in compiled.as_text().splitlines() if " = " in line)


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        chains, steps, repeats, dim = 8, 5, 3, 6
    elif args.full:
        chains, steps, repeats, dim = 8192, 100, 30, 100
    else:
        chains, steps, repeats, dim = 512, 100, 30, 100
    chains = args.chains or chains
    steps = args.steps or steps
    repeats = args.repeats or repeats
    n = args.num_devices
    mesh = mesh_for(n)
    target = (
        gaussian(dim)
        if args.target == "gauss100"
        else (logistic(100, 4, 20_000) if args.smoke else logistic())
    )
    kernel = samplers.MCLMC(step_size=0.5, L=5.0)
    keys = enn.chain_keys(jax.random.key(args.seed), chains)
    x0 = jax.random.normal(jax.random.key(args.seed + 1), (chains, target.dim))
    init = enn.ensemble_map(
        lambda k, t, x, key: k.init(t, x, key),
        mesh=mesh,
        in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
        out_roles=enn.PER_CHAIN,
    )
    state = init(kernel, target, x0, keys)
    placed = (
        jax.device_put(target, NamedSharding(mesh, P())),
        jax.device_put(state, NamedSharding(mesh, P("chains"))),
        jax.device_put(keys, NamedSharding(mesh, P("chains"))),
    )

    def one(k: Any, t: Any, s: Any, key: Any) -> Any:
        return k.step(t, s, key)[0]

    def scan(k: Any, t: Any, s: Any, key: Any) -> Any:
        def body(s: Any, i: Any) -> tuple:
            return k.step(t, s, jax.random.fold_in(key, i))[0], None

        return jax.lax.scan(body, s, jnp.arange(steps))[0]

    records: list[dict] = []
    for workload, fn in (("1 step", one), (f"scan {steps} steps", scan)):
        ours = enn.ensemble_map(
            fn,
            mesh=mesh,
            in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
            out_roles=enn.PER_CHAIN,
        )
        ours_jit = jax.jit(lambda t, s, key, ours=ours: ours(kernel, t, s, key))

        def body(t: Any, s: Any, key: Any, fn: Any = fn) -> Any:
            return jax.vmap(lambda s1, k1: fn(kernel, t, s1, k1))(s, key)

        hand = jax.jit(
            jax.shard_map(
                body, mesh=mesh, in_specs=(P(), P("chains"), P("chains")), out_specs=P("chains")
            )
        )
        fns = {
            "ensemble_map (eager call)": lambda t, s, k, ours=ours: ours(kernel, t, s, k),
            "ensemble_map (eager, inputs pre-placed)": lambda t, s, k, ours=ours: ours(
                kernel, t, s, k
            ),
            "ensemble_map under jax.jit": ours_jit,
            "hand-written shard_map+vmap": hand,
        }
        call_args = {name: (target, state, keys) for name in fns}
        # The same call with the broadcast target already replicated on the mesh and the
        # keys already sharded: what is left is ensemble_map's own Python work.
        call_args["ensemble_map (eager, inputs pre-placed)"] = placed
        number = 20 if workload == "1 step" else 1
        result = interleaved(fns, call_args, repeats, number)
        hand_min, hand_med = result["hand-written shard_map+vmap"]
        sizes = {
            "ensemble_map under jax.jit": hlo_size(ours_jit.lower(target, state, keys).compile()),
            "hand-written shard_map+vmap": hlo_size(hand.lower(target, state, keys).compile()),
        }
        sizes["ensemble_map (eager call)"] = sizes["ensemble_map under jax.jit"]
        sizes["ensemble_map (eager, inputs pre-placed)"] = sizes["ensemble_map under jax.jit"]
        for name, (t_min, t_med) in result.items():
            emit(
                dict(
                    benchmark=BENCH,
                    workload=workload,
                    target=args.target,
                    devices=n,
                    chains=chains,
                    impl=name,
                    min_us=t_min * 1e6,
                    median_us=t_med * 1e6,
                    ratio_min=t_min / hand_min,
                    ratio_median=t_med / hand_med,
                    hlo_instructions=sizes[name],
                    repeats=repeats,
                    calls_per_timing=number,
                ),
                records,
            )
    return records
