"""The command line's full matrix: every `--target` x every `--sampler` with the defaults.

``python -m benchmarks.cli_matrix [--quick] [--chains 64] [--steps 200] [--jsonl FILE]``

Each combination runs ``python -m samplers run --target T --sampler S --chains 64 --steps
200 --devices 4 --no-progress --no-cache --out DIR`` (default warmup and dimensions) in
its own subprocess (the device count is fixed per process, and one combination that
crashes does not take the others down), reads the run's ``diagnostics.json`` and prints
one JSON line per combination, then a Markdown table: converged or not, max R-hat (nested
R-hat where the CLI uses superchains), min ESS, divergences, mean acceptance and the
verdict's first reason. ``--quick`` runs two cheap combinations (for the smoke test). No
timing is asserted anywhere; ``wall_s`` is for reading only.

It is not one of ``python -m benchmarks NAME``'s peer comparisons (there is no peer), so
it is run as a module of its own.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("gaussian", "rotated-gaussian", "banana", "rosenbrock", "funnel", "bimodal", "logistic")
SAMPLERS = ("rwm", "mala", "hmc", "ghmc", "nuts", "mclmc", "adjusted-mclmc", "laps")
QUICK = (("banana", "hmc"), ("banana", "mala"))

COLUMNS = [
    ("target", "target"),
    ("sampler", "sampler"),
    ("converged", "converged"),
    ("max_rhat", "max R-hat"),
    ("min_ess", "min ESS"),
    ("divergences", "divergences"),
    ("acceptance", "acceptance"),
    ("reason", "first reason"),
]


def _finite_max(values: list | None) -> float | None:
    vals = [v for v in values or [] if v is not None and math.isfinite(v)]
    return max(vals) if vals else None


def run_one(target: str, sampler: str, chains: int, steps: int, extra: list[str]) -> dict:
    """One combination in a subprocess; its diagnostics as a flat record."""
    record: dict[str, Any] = {"benchmark": "cli_matrix", "target": target, "sampler": sampler}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "samplers", "run", "--target", target, "--sampler",
                   sampler, "--chains", str(chains), "--steps", str(steps), "--devices", "4",
                   "--no-progress", "--no-cache", "--out", out, *extra]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        record["wall_s"] = round(time.perf_counter() - start, 1)
        path = Path(out) / "diagnostics.json"
        if proc.returncode != 0 or not path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return record | {"status": "crashed", "error": tail[0][:300]}
        data = json.loads(path.read_text())
    rhat = data["nested_rhat"] if data.get("nested_rhat") is not None else data["rhat"]
    reasons = data.get("reasons") or []
    return record | {
        "status": "ok",
        "converged": bool(data["converged"]),
        "nested": data.get("nested_rhat") is not None,
        "max_rhat": _finite_max(rhat),
        "min_ess": min(data["ess"]) if data.get("ess") else None,
        "divergences": data["num_divergent"],
        "acceptance": data["acceptance_rate"],
        "reason": reasons[0]["problem"] if reasons else "",
    }


def _cell(record: dict, key: str) -> str:
    if record.get("status") != "ok":
        return {"converged": "crashed", "reason": record.get("error", "")}.get(key, "")
    value = record.get(key)
    if key == "converged":
        return "yes" if value else "**no**"
    if value is None:
        return "n/a"
    if key == "max_rhat":
        return f"{value:.3f}"
    if key == "min_ess":
        return f"{value:.0f}"
    if key == "acceptance":
        return f"{value:.2f}"
    return str(value)


def table(records: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for r in records:
        lines.append("| " + " | ".join(_cell(r, k) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cli_matrix", description=__doc__)
    p.add_argument("--quick", action="store_true", help=f"only {QUICK} (for the smoke test)")
    p.add_argument("--chains", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset")
    p.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated subset")
    p.add_argument("--jsonl", default=None, help="also append each record to this file")
    p.add_argument("extra", nargs="*", help="more options for `samplers run` (after --)")
    args = p.parse_args(argv)
    if args.quick:
        combos = list(QUICK)
        args.chains, args.steps = min(args.chains, 16), min(args.steps, 50)
        args.extra = ["--warmup", "50", *args.extra]
    else:
        combos = [(t, s) for t in args.targets.split(",") for s in args.samplers.split(",")]
    records = []
    for target, sampler in combos:
        record = run_one(target, sampler, args.chains, args.steps, args.extra)
        records.append(record)
        line = json.dumps(record)
        print(line, flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(line + "\n")
    print(f"\n## cli_matrix ({args.chains} chains x {args.steps} steps, default warmup)\n")
    print(table(records))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
