"""LAPS time per step and peak memory for 1, 2, 4, 8 devices and 64..4096 chains.

The whole run, `samplers.run(None, gauss100, ..., adaptation=samplers.LAPS(num_steps1=n1,
num_adaptation_steps=n2, early_stop=False), num_steps=n3)`, is traced under `jax.jit` into
one program, compiled ahead of time (`jit(f).lower(...).compile()`, timed as `compile_s`),
and its per-device memory read from `compiled.memory_analysis()`: arguments + outputs +
temporaries - aliased buffers ("peak"). The compiled program is then run three times;
`run_s` is the fastest. Time per step is `run_s / (n1 + n2 + n3)`; time per gradient is
`run_s / gradient evaluations per chain` (what one ensemble-wide gradient costs).

Simulated CPU devices share the machine's cores, so more devices do not mean more compute
here: the rows show that memory per device falls as chains / devices and that the program
does not slow down with the device count. Real speedups need real devices (`--full`).
"""

import argparse
import time
from typing import Any

import jax
import numpy as np

import samplers

from ._common import clock, emit, gaussian, mesh_for, print_machine

BENCH = "scaling"

COLUMNS = [
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("compile_s", "compile s", ".1f"),
    ("run_s", "run s", ".3f"),
    ("step_ms", "ms/step", ".3f"),
    ("us_per_grad", "µs/grad", ".1f"),
    ("chain_grads_per_s", "chain-grads/s", ".3g"),
    ("peak_mib", "peak MiB/device", ".2f"),
    ("temp_mib", "temp MiB/device", ".2f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", default=None, help="comma-separated (default 64,256,1024,4096)")
    p.add_argument("--n1", type=int, default=None, help="phase-1 steps (default 100)")
    p.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        default_chains, dim, n1, n2, n3 = "16,32", 6, 10, 2, 2
    elif args.full:
        default_chains, dim, n1, n2, n3 = "64,256,1024,4096,16384,65536", 100, 100, 8, 8
    else:
        default_chains, dim, n1, n2, n3 = "64,256,1024,4096", 100, 100, 8, 8
    n1 = args.n1 or n1
    counts = [int(c) for c in (args.chains or default_chains).split(",")]
    n = args.num_devices
    mesh = mesh_for(n)
    target = gaussian(dim)
    laps = samplers.LAPS(num_steps1=n1, num_adaptation_steps=n2, early_stop=False)

    def whole_run(positions: Any, key: Any) -> tuple:
        result = samplers.run(
            None,
            target,
            positions,
            key=key,
            num_steps=n3,
            adaptation=laps,
            mesh=mesh,
            chunk_size=n3,
            progress=False,
        )
        return (result.state.position, result.adaptation_info.num_grads, result.num_grads)

    records: list[dict] = []
    for chains in counts:
        if chains % n:
            continue
        positions = jax.random.normal(jax.random.key(args.seed), (chains, dim))
        key = jax.random.key(args.seed + 1)
        with clock() as c:
            compiled = jax.jit(whole_run).lower(positions, key).compile()
        mem = compiled.memory_analysis()
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(positions, key))
            best = min(best, time.perf_counter() - t0)
        grads = float(out[1]) + float(np.mean(out[2]))
        steps = n1 + n2 + n3
        row = dict(
            benchmark=BENCH,
            devices=n,
            chains=chains,
            chains_per_device=chains // n,
            dim=dim,
            steps=steps,
            grads_per_chain=grads,
            compile_s=c.compile_s,
            run_s=best,
            step_ms=best / steps * 1e3,
            us_per_grad=best / grads * 1e6,
            chain_grads_per_s=grads * chains / best,
        )
        if mem is not None:
            peak = (
                mem.argument_size_in_bytes
                + mem.output_size_in_bytes
                + mem.temp_size_in_bytes
                - mem.alias_size_in_bytes
            )
            row.update(
                peak_mib=peak / 2**20,
                temp_mib=mem.temp_size_in_bytes / 2**20,
                argument_bytes=mem.argument_size_in_bytes,
                output_bytes=mem.output_size_in_bytes,
                temp_bytes=mem.temp_size_in_bytes,
            )
        emit(row, records)
    return records
