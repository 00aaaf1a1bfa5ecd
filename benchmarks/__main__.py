"""``python -m benchmarks NAME [--devices N[,M...]] [--full] [--smoke] [options]``.

The device count must be fixed before JAX initialises, so the name and ``--devices`` are
parsed first and ``XLA_FLAGS`` is set before the benchmark module (which imports JAX) is
loaded. With several device counts, one subprocess runs per count and this process merges
their JSON lines into one table.
"""

import argparse
import importlib
import sys

from . import BENCHMARKS
from ._common import fan_out, parse_devices, print_table, set_device_count


def _pre_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", add_help=False)
    p.add_argument("name", nargs="?", choices=sorted(BENCHMARKS) + ["all"])
    p.add_argument("--devices", default=None)
    p.add_argument("-h", "--help", action="store_true")
    return p


def _usage() -> str:
    lines = [
        "usage: python -m benchmarks NAME [--devices N[,M...]] [--full] [--smoke] [options]",
        "",
        "benchmarks:",
    ]
    for name, (devices, text) in BENCHMARKS.items():
        lines.append(f"  {name:<14} {text} (default devices: {','.join(map(str, devices))})")
    lines.append(f"  {'all':<14} every benchmark above, in turn, at its default device counts")
    lines.append("")
    lines.append("python -m benchmarks NAME --help lists a benchmark's options.")
    return "\n".join(lines)


def _run_all(rest: list[str]) -> int:
    """Every benchmark in its own process(es), with the shared options (--full, --smoke,
    --seed) passed on; returns 1 if any of them failed."""
    import subprocess

    status = 0
    for name in BENCHMARKS:
        print(f"# python -m benchmarks {' '.join([name, *rest])}", flush=True)
        status |= subprocess.call([sys.executable, "-m", "benchmarks", name, *rest]) != 0
    return int(status)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre, rest = _pre_parser().parse_known_args(argv)
    if pre.name is None:
        print(_usage())
        return 0 if pre.help else 2
    if pre.name == "all":
        return _run_all(rest)
    devices = parse_devices(pre.devices, BENCHMARKS[pre.name][0])
    if len(devices) > 1 and not pre.help:
        set_device_count(max(devices))
        module = importlib.import_module(f"benchmarks.{pre.name}")
        records = fan_out(pre.name, rest, devices)
        print_table(records, module.COLUMNS, title=pre.name)
        return 0 if all(r.get("status") != "crashed" for r in records) else 1
    set_device_count(devices[0])
    module = importlib.import_module(f"benchmarks.{pre.name}")
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {pre.name}", description=module.__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--devices",
        default=None,
        help="device count, or a comma-separated list (one subprocess each)",
    )
    parser.add_argument("--full", action="store_true", help="accelerator-scale sizes")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for the tests)")
    parser.add_argument("--no-table", action="store_true", help="JSON lines only")
    parser.add_argument("--seed", type=int, default=0)
    module.add_arguments(parser)
    args = parser.parse_args(rest + (["--help"] if pre.help else []))
    args.num_devices = devices[0]
    records = module.run(args)
    if not args.no_table:
        print_table(records, module.COLUMNS, title=pre.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
