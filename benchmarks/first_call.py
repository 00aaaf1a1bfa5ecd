"""The first call in a fresh process: samplers.LAPS vs BlackJAX LAPS, cold and warm cache.

What a user waits for when a script starts: a new Python process, one call. Each timed
call runs in its own subprocess (imports and the target's construction are not timed; the
call is, compilation included) with JAX's persistent compilation cache either off
(``cold``) or on a folder that an earlier, untimed process of the same side filled
(``warm``: the state of a machine that has run the job once). Both sides use the same
cache settings (`samplers.enable_compilation_cache(folder)`, which sets JAX's own three
options; BlackJAX can use JAX's cache too) and run the ``laps`` benchmark's workload:
`n1` unadjusted steps, then `n_adjusted` adjusted samples of which the first half tune
(early stop off on both sides), 512 chains on the 100-d Gaussian. The repeats are
interleaved (ours cold, ours warm, BlackJAX cold, BlackJAX warm, then again); each row
gives the min and median of its repeats; ``vs blackjax cold`` divides by BlackJAX's
cold first call and ``vs blackjax, same cache`` by BlackJAX's with the same cache state
(min by min, median by median).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from . import laps
from ._common import cache_for, emit, fills_cache_untimed, have, print_machine, skipped

BENCH = "first_call"
ROOT = Path(__file__).resolve().parent.parent

COLUMNS = [
    ("impl", "impl", ""),
    ("cache", "cache", ""),
    ("devices", "dev", "d"),
    ("chains", "chains", "d"),
    ("repeats", "repeats", "d"),
    ("first_call_s_min", "first call s (min)", ".2f"),
    ("first_call_s_median", "(median)", ".2f"),
    ("compile_s_min", "compile events s (min)", ".2f"),
    ("vs_blackjax_cold_min", "vs blackjax cold (min)", ".2f"),
    ("vs_blackjax_cold_median", "(median)", ".2f"),
    ("vs_blackjax_same_cache_min", "vs blackjax, same cache (min)", ".2f"),
    ("vs_blackjax_same_cache_median", "(median)", ".2f"),
    ("load_avg_1m", "load", ".1f"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chains", type=int, default=None, help="chains (default 512)")
    p.add_argument("--n1", type=int, default=None, help="phase-1 steps (default 500)")
    p.add_argument("--n-adjusted", type=int, default=None, help="adjusted samples (default 33)")
    p.add_argument("--repeats", type=int, default=None, help="timed processes per row (3)")
    p.add_argument("--skip-peer", action="store_true", help="run our side only")
    # Internal: one timed call in this process (what the parent spawns).
    p.add_argument("--child", choices=("ensemblenn", "blackjax"), help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", default=None, help=argparse.SUPPRESS)


def _child(args: argparse.Namespace) -> None:
    """One first call, printed as a JSON line."""
    import samplers

    from ._common import clock, closed_over_logdensity, mesh_for

    if args.cache_dir:
        samplers.enable_compilation_cache(args.cache_dir)
    args.targets, args.early_stop = "gauss100", False
    s = laps.sizes(args)
    target = laps.targets(args, s)["gauss100"]
    logdensity = closed_over_logdensity(target)
    mesh = mesh_for(args.num_devices)
    with clock() as c:
        if args.child == "ensemblenn":
            laps.run_ours(target, logdensity, s, args, mesh)
        else:
            laps.run_blackjax(target, logdensity, s, args, mesh, calls=1)
    print(json.dumps({"child": args.child, "wall": c.wall, "compile_s": c.compile_s}))


def _spawn(args: argparse.Namespace, impl: str, cache: str | None) -> dict:
    command = [sys.executable, "-m", "benchmarks", BENCH, "--devices", str(args.num_devices),
               "--child", impl, "--seed", str(args.seed), "--no-table"]  # fmt: skip
    for flag, value in (("--chains", args.chains), ("--n1", args.n1),
                        ("--n-adjusted", args.n_adjusted)):  # fmt: skip
        if value is not None:
            command += [flag, str(value)]
    if args.smoke:
        command.append("--smoke")
    if cache is not None:
        command += ["--cache-dir", cache]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # A cache from the environment (the test suite sets one) would make "cold" warm.
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.strip().splitlines() if "Error" in line]
        raise RuntimeError(f"{impl} child failed: {errors[-3:] or proc.stderr[-500:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith('{"child"')][0])


def run(args: argparse.Namespace) -> list[dict]:
    if args.child:
        _child(args)
        return []
    # The machine line comes after the children: on a TPU the process that first opens the
    # chip holds it, and a child would then fail to start.
    repeats = args.repeats or (1 if args.smoke else 3)
    impls = ["ensemblenn"]
    records: list[dict] = []
    peer = have("blackjax") and not args.skip_peer
    if peer:
        impls.append("blackjax")
    elif not args.skip_peer:
        emit(skipped(BENCH, "blackjax", "blackjax", devices=args.num_devices), records)
    chains = laps.sizes(args)["chains"]
    timings: dict[tuple[str, str], list[dict]] = {
        (i, c): [] for i in impls for c in ("cold", "warm")
    }
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        caches = {impl: str(Path(folder) / impl) for impl in impls}
        fill = fills_cache_untimed(args.smoke, repeats)
        for impl in impls if fill else ():  # the machine's first run of each side
            _spawn(args, impl, caches[impl])
        for _ in range(repeats):
            for impl in impls:
                for cache in ("cold", "warm"):
                    loads.append(os.getloadavg()[0])
                    used = cache_for(cache, caches[impl], fill)
                    timings[impl, cache].append(_spawn(args, impl, used))
    print_machine(BENCH)
    summary = {}
    for (impl, cache), runs in timings.items():
        walls = [r["wall"] for r in runs]
        summary[impl, cache] = (min(walls), statistics.median(walls))
    for (impl, cache), runs in timings.items():
        lo, med = summary[impl, cache]
        row = dict(
            benchmark=BENCH, impl=impl, cache=cache, devices=args.num_devices, chains=chains,
            repeats=len(runs), first_call_s_min=lo, first_call_s_median=med,
            compile_s_min=min(r["compile_s"] for r in runs),
            load_avg_1m=round(max(loads), 2),
        )  # fmt: skip
        if ("blackjax", "cold") in summary:
            base_lo, base_med = summary["blackjax", "cold"]
            same_lo, same_med = summary["blackjax", cache]
            row.update(
                vs_blackjax_cold_min=lo / base_lo,
                vs_blackjax_cold_median=med / base_med,
                vs_blackjax_same_cache_min=lo / same_lo,
                vs_blackjax_same_cache_median=med / same_med,
            )
        emit(row, records)
    return records
