"""samplers.HMC vs BlackJAX HMC on the logistic regression: the same step, timed side by side.

Both sides run the same workload: `LogisticRegression` (1000 x 50 by default), the same
chains started from the same draws, fixed hyperparameters (step size, number of leapfrog
steps, identity inverse mass matrix; no adaptation) and the same number of steps. Ours runs
three ways: `samplers.run` with its defaults (default chunking, default `block_size`),
`samplers.run` with 4 chunks and with one chunk (`chunk_size=num_steps`), and the bare
kernel, a `lax.scan` of `HMC.step` inside `enn.ensemble_map` (on the target module, and
on the very closed-over function BlackJAX gets). BlackJAX runs `jax.jit` of a `lax.scan` of
`jax.vmap(blackjax.hmc(...).step)`. Every variant is compiled first, then all are timed in
alternation in this process (min and median of the repeats); `ratio` is to BlackJAX.
"""

import argparse
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
import samplers

from ._common import (
    closed_over_logdensity,
    emit,
    error_text,
    have,
    logistic,
    mesh_for,
    print_machine,
    skipped,
)
from .overhead import interleaved

BENCH = "hmc"

COLUMNS = [
    ("target", "target", ""),
    ("impl", "impl", ""),
    ("path", "path", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("steps", "steps", "d"),
    ("step_ms", "ms/step (min)", ".2f"),
    ("step_ms_median", "ms/step (median)", ".2f"),
    ("ratio", "vs BlackJAX (min)", ".2f"),
    ("ratio_median", "vs BlackJAX (median)", ".2f"),
    ("acceptance", "acceptance", ".3f"),
    ("load", "load", ".1f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="default 512")
    p.add_argument("--steps", type=int, default=None, help="HMC steps (default 20)")
    p.add_argument("--step-size", type=float, default=0.01)
    p.add_argument("--leapfrog", type=int, default=10, help="leapfrog steps per HMC step")
    p.add_argument("--repeats", type=int, default=None, help="interleaved timings (default 5)")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        chains, steps, repeats, data = 8, 3, 2, (100, 4, 20_000)
    else:
        chains, steps, repeats, data = 512, 20, 5, (1000, 50, 200_000)
    chains, steps, repeats = args.chains or chains, args.steps or steps, args.repeats or repeats
    n = args.num_devices
    mesh = mesh_for(n)
    target = logistic(*data)
    dim = target.dim
    x0 = jax.device_put(
        jax.random.normal(jax.random.key(args.seed), (chains, dim)) * 0.1,
        NamedSharding(mesh, P("chains")),
    )
    # A fixed path, as BlackJAX's: the same workload on both sides.
    kernel = samplers.HMC(
        step_size=args.step_size, num_integration_steps=args.leapfrog, jitter=False
    )

    def run_default() -> Any:
        r = samplers.run(
            kernel, target, x0, key=jax.random.key(1), num_steps=steps, mesh=mesh, progress=False
        )
        return r.state.position, r.acceptance_rate

    def run_chunks(size: int) -> Any:
        r = samplers.run(
            kernel,
            target,
            x0,
            key=jax.random.key(1),
            num_steps=steps,
            chunk_size=size,
            mesh=mesh,
            progress=False,
        )
        return r.state.position, r.acceptance_rate

    keys = enn.chain_keys(jax.random.key(2), chains)
    init = enn.ensemble_map(
        lambda k, t, x, key: k.init(t, x, key),
        mesh=mesh,
        in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
        out_roles=enn.PER_CHAIN,
    )
    state0 = init(kernel, target, x0, keys)

    def scan(k: Any, t: Any, s: Any, key: Any) -> Any:
        def body(s: Any, i: Any) -> tuple:
            s, info = k.step(t, s, jax.random.fold_in(key, i))
            return s, info.acceptance_rate

        s, acc = jax.lax.scan(body, s, jnp.arange(steps))
        return s.position, acc.mean()

    bare = enn.ensemble_map(
        scan,
        mesh=mesh,
        in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
        out_roles=enn.PER_CHAIN,
    )

    closed = closed_over_logdensity(target)  # the function BlackJAX gets
    fns: dict[str, Any] = {
        "samplers.run (defaults)": run_default,
        "samplers.run (4 chunks)": lambda: run_chunks(max(steps // 4, 1)),
        "samplers.run (one chunk)": lambda: run_chunks(steps),
        "ensemble_map(scan(step))": lambda: bare(kernel, target, state0, keys),
        "ensemble_map(scan(step)), closed-over log density": lambda: bare(
            kernel, closed, state0, keys
        ),
    }
    records: list[dict] = []
    peer = None
    if args.skip_peer:
        pass
    elif not have("blackjax"):
        emit(skipped(BENCH, "blackjax", "blackjax", target="logreg"), records)
    else:
        try:
            peer = _blackjax(target, x0, steps, args)
            fns["blackjax"] = peer
        except Exception as err:  # noqa: BLE001 - reported as a row
            emit(dict(benchmark=BENCH, impl="blackjax", status=error_text(err)), records)
    timing = interleaved(fns, {k: () for k in fns}, repeats, number=1)
    accept = {k: float(np.mean(np.asarray(fn()[1]))) for k, fn in fns.items()}
    base = timing.get("blackjax")
    for label, (t_min, t_med) in timing.items():
        emit(
            dict(
                benchmark=BENCH,
                target=f"logreg {data[0]}x{data[1]}",
                impl="blackjax" if label == "blackjax" else "ensemblenn",
                path=label,
                devices=n,
                chains=chains,
                steps=steps,
                step_size=args.step_size,
                leapfrog=args.leapfrog,
                step_ms=t_min / steps * 1e3,
                step_ms_median=t_med / steps * 1e3,
                ratio=t_min / base[0] if base else None,
                ratio_median=t_med / base[1] if base else None,
                acceptance=accept[label],
                load=os.getloadavg()[0],
                status="ok",
            ),
            records,
        )
    return records


def _blackjax(target: Any, x0: Any, steps: int, args: argparse.Namespace) -> Any:
    import blackjax

    logdensity = closed_over_logdensity(target)
    hmc = blackjax.hmc(
        logdensity,
        step_size=args.step_size,
        inverse_mass_matrix=jnp.ones(target.dim),
        num_integration_steps=args.leapfrog,
    )
    states = jax.vmap(hmc.init)(x0)
    keys = jax.random.split(jax.random.key(3), x0.shape[0])

    @jax.jit
    def go(states: Any, keys: Any) -> Any:
        def body(s: Any, i: Any) -> tuple:
            ks = jax.vmap(lambda k: jax.random.fold_in(k, i))(keys)
            s, info = jax.vmap(hmc.step)(ks, s)
            return s, info.acceptance_rate

        s, acc = jax.lax.scan(body, states, jnp.arange(steps))
        return s.position, acc.mean(axis=0)

    return lambda: go(states, keys)
