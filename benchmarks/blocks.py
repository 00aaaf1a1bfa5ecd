"""The price of device-count invariance: `samplers.run` with `block_size` vs one wide batch.

`block_size=k` runs each chain's transition through `enn.batch_invariant`, k chains at a
time in a loop, so that a run is bitwise identical on any device count; `block_size=None`
vmaps all of a device's chains at once. Both run in this process, interleaved, on the
same chains and keys; reported is the sampling time (compilation excluded: every variant
is warmed up first) and its ratio to `None`, plus whether the final positions equal those
of `block_size=None` bit for bit (they need not: that is the point).
"""

import argparse
import time
from typing import Any

import jax
import numpy as np

import samplers

from ._common import emit, gaussian, logistic, mesh_for, print_machine

BENCH = "blocks"

COLUMNS = [
    ("target", "target", ""),
    ("kernel", "kernel", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("chains_per_device", "chains/dev", "d"),
    ("block_size", "block_size", ""),
    ("min_s", "min s", ".3f"),
    ("ratio_min", "ratio to None (min)", ".2f"),
    ("ratio_median", "ratio (median)", ".2f"),
    ("bitwise_as_none", "same bits as None", ""),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", default=None, help="comma-separated (default 64,512)")
    p.add_argument(
        "--blocks",
        default=None,
        help="comma-separated block sizes (ints, auto, none; default none,auto,4,16,64, and "
        "none,auto,2 with --smoke: each size is a compilation)",
    )
    p.add_argument("--steps", type=int, default=None, help="sampling steps (default 200)")
    p.add_argument("--repeats", type=int, default=None, help="timings per variant")
    p.add_argument(
        "--target",
        choices=("gauss100", "logreg"),
        default="gauss100",
        help="gauss100 (a 3-5 µs gradient) or logreg (1000 x 50: a matrix product per chain)",
    )
    p.add_argument("--kernels", default="mclmc,hmc", help="comma-separated: mclmc, hmc")


def run(args: argparse.Namespace) -> list[dict]:
    print_machine(BENCH)
    if args.smoke:
        chain_counts, steps, repeats, dim = [8], 5, 2, 6
    elif args.full:
        chain_counts, steps, repeats, dim = [512, 8192], 200, 7, 100
    else:
        chain_counts, steps, repeats, dim = [64, 512], 200, 7, 100
    if args.chains:
        chain_counts = [int(c) for c in args.chains.split(",")]
    steps, repeats = args.steps or steps, args.repeats or repeats
    sizes = args.blocks or ("none,auto,2" if args.smoke else "none,auto,4,16,64")
    blocks = [
        {"none": None, "auto": "auto"}[b] if b in ("none", "auto") else int(b)
        for b in sizes.split(",")
    ]
    if None not in blocks:
        blocks.insert(0, None)
    # Start scale and step sizes (MCLMC, HMC) per target; logreg's are the `hmc` benchmark's.
    if args.target == "logreg":
        target = logistic(*((100, 4, 20_000) if args.smoke else (1000, 50, 200_000)))
        dim, scale, h_mclmc, h_hmc = target.dim, 0.1, 0.02, 0.01
    else:
        target, scale, h_mclmc, h_hmc = gaussian(dim), 1.0, 0.5, 0.3
    mesh = mesh_for(args.num_devices)
    every = {
        "mclmc": ("MCLMC", samplers.MCLMC(step_size=h_mclmc, L=5.0)),
        "hmc": (
            "HMC (10 leapfrog)",
            samplers.HMC(step_size=h_hmc, num_integration_steps=10, jitter=False),
        ),
    }
    kernels = dict(every[k.strip()] for k in args.kernels.split(","))
    records: list[dict] = []
    for chains in chain_counts:
        positions = jax.random.normal(jax.random.key(args.seed), (chains, dim)) * scale
        for name, kernel in kernels.items():

            def go(block: Any, kernel: Any = kernel, positions: Any = positions) -> Any:
                result = samplers.run(
                    kernel,
                    target,
                    positions,
                    key=jax.random.key(1),
                    num_steps=steps,
                    chunk_size=steps,
                    mesh=mesh,
                    progress=False,
                    block_size=block,
                )
                return jax.block_until_ready(result.state.position)

            finals = {b: np.asarray(go(b)) for b in blocks}  # compile and warm up
            times: dict[Any, list[float]] = {b: [] for b in blocks}
            for r in range(repeats):
                for b in blocks if r % 2 == 0 else blocks[::-1]:
                    t0 = time.perf_counter()
                    go(b)
                    times[b].append(time.perf_counter() - t0)
            base_min, base_med = min(times[None]), float(np.median(times[None]))
            for b in blocks:
                t_min, t_med = min(times[b]), float(np.median(times[b]))
                emit(
                    dict(
                        benchmark=BENCH,
                        kernel=name,
                        target=args.target,
                        devices=args.num_devices,
                        chains=chains,
                        chains_per_device=chains // args.num_devices,
                        block_size=str(b),
                        steps=steps,
                        min_s=t_min,
                        ratio_min=t_min / base_min,
                        ratio_median=t_med / base_med,
                        bitwise_as_none=bool(np.array_equal(finals[b], finals[None])),
                        status="ok",
                        impl=f"block_size={b}",
                    ),
                    records,
                )
    return records
