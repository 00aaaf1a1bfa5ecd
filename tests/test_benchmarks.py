"""Smoke tests of `python -m benchmarks`: every benchmark runs at a tiny size (`--smoke`).

Each benchmark runs in a subprocess (the device count is fixed per process) and its JSON
lines are checked: our side must always run without error; a peer (BlackJAX, NumPyro,
emcee) must run when it is installed and be reported as skipped when it is not (CI
installs only the dev and docs extras). No timing is asserted. The subprocess tests take
a few minutes in all and are marked slow (CI still runs them).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1500

# benchmark -> (our impl names, {peer impl name: module})
OURS = {
    "laps": ["ensemblenn"],
    "overhead": ["ensemble_map (eager call)", "ensemble_map under jax.jit"],
    "floor": ["MALA", "MCLMC (McLachlan)"],
    "communication": None,  # every row is ours
    "ensemble": ["ensemblenn"],
    "nuts": ["samplers.LAPS"],
    "scaling": None,
    "blocks": None,
    "hmc": ["ensemblenn"],
    "hierarchical": ["ensemblenn"],
    "first_call": ["ensemblenn"],
    "accelerator": ["run (defaults)", "run (bitwise)", "bare ensemble_map(scan)"],
    "kernels": None,
    "step_parts": None,
}
PEERS = {
    "laps": {"blackjax": "blackjax"},
    "ensemble": {"numpyro AIES": "numpyro", "emcee": "emcee"},
    "nuts": {"numpyro NUTS": "numpyro"},
    "hmc": {"blackjax": "blackjax"},
    "hierarchical": {"blackjax": "blackjax"},
    "first_call": {"blackjax": "blackjax"},
    "accelerator": {"blackjax vmap": "blackjax", "blackjax vmap, draws kept": "blackjax"},
}


def run_benchmark(name: str, *extra: str, hide: str = "") -> tuple[list[dict], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    if hide:
        env["ENSEMBLENN_BENCH_HIDE"] = hide
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--smoke", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert records, f"{name} printed no JSON lines:\n{proc.stdout[-3000:]}"
    return records, proc.stdout


_CACHE: dict[str, tuple[list[dict], str]] = {}


def smoke(name: str) -> tuple[list[dict], str]:
    if name not in _CACHE:
        _CACHE[name] = run_benchmark(name, "--devices", "2")
    return _CACHE[name]


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OURS))
def test_our_side_runs(name):
    records, stdout = smoke(name)
    assert all(r["benchmark"] == name for r in records)
    ours = [r for r in records if OURS[name] is None or r.get("impl") in OURS[name]]
    assert ours, f"no rows of ours in {name}: {records}"
    bad = [r for r in ours if r.get("status") != "ok"]
    assert not bad, bad
    assert all(r["devices"] == 2 for r in records if "devices" in r)
    assert f"## {name}" in stdout and "|---" in stdout  # the table


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, impl, module", [(n, i, m) for n, peers in PEERS.items() for i, m in peers.items()]
)
def test_peer_runs_or_is_skipped(name, impl, module):
    records, _ = smoke(name)
    rows = [r for r in records if r.get("impl") == impl]
    assert rows, f"no {impl} row in {name}"
    if installed(module):
        assert all(r["status"] == "ok" for r in rows), rows
    else:
        assert all(r["status"] == "skipped" for r in rows), rows


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PEERS))
def test_without_peers_our_side_still_runs(name):
    hidden = sorted(set(PEERS[name].values()))
    if any(installed(m) for m in hidden):
        extra = ["--devices", "2"] + (["--n1", "5"] if name == "laps" else [])
        records, _ = run_benchmark(name, *extra, hide=",".join(hidden))
    else:  # none installed (CI installs no BlackJAX): hiding them would rerun the smoke run
        records, _ = smoke(name)
    for impl in PEERS[name]:
        rows = [r for r in records if r.get("impl") == impl]
        assert rows and all(r["status"] == "skipped" for r in rows), rows
        assert all("not installed" in r["error"] for r in rows)
    ours = [r for r in records if r.get("impl") in OURS[name]]
    assert ours and all(r["status"] == "ok" for r in ours), ours


@pytest.mark.slow
def test_laps_peer_metrics_present():
    pytest.importorskip("blackjax")
    records, _ = smoke("laps")
    for impl in ("ensemblenn", "blackjax"):
        (row,) = [r for r in records if r.get("impl") == impl and r.get("mesh") == "auto"]
        for key in ("compile_s", "run_s", "grads_per_chain", "grads_per_s", "b2_max", "b2_mean"):
            assert isinstance(row[key], int | float), (impl, key, row)


@pytest.mark.slow
def test_several_device_counts_fan_out_to_subprocesses():
    records, stdout = run_benchmark(
        "overhead", "--devices", "1,2", "--steps", "2", "--repeats", "1"
    )
    assert {r["devices"] for r in records} == {1, 2}
    assert stdout.count("# running:") == 2
    assert stdout.count("## overhead") == 1  # one merged table


def test_communication_parser_counts_loop_collectives():
    sys.path.insert(0, str(ROOT))
    from benchmarks.communication import Hlo

    text = """HloModule m

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %ag = f32[8,4]{1,0} all-gather(f32[2,4]{1,0} %x), dimensions={0}
  %ar = (f32[4]{0}, s32[]) all-reduce(%y, %z), to_apply=%add
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %c = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %g = f32[16]{0} all-gather-start(f32[4]{0} %a), dimensions={0}
  %d = f32[16]{0} all-gather-done(%g)
  %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body
}
"""
    once, loop = Hlo(text).summary()
    assert (once["scope"], once["collectives"], once["bytes"]) == ("once", 1, 64)
    assert (loop["scope"], loop["collectives"], loop["bytes"]) == ("loop step", 2, 128 + 20)


@pytest.mark.slow
def test_cli_matrix_quick_prints_a_row_per_combination():
    """`python -m benchmarks.cli_matrix --quick`: its two combinations run through the CLI
    and land in the table (whether they converge at this tiny size is not asserted)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli_matrix", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["target"], r["sampler"]) for r in records] == [("banana", "hmc"), ("banana", "mala")]
    for r in records:
        assert r["status"] == "ok" and isinstance(r["converged"], bool), r
        assert r["max_rhat"] > 0.9 and r["min_ess"] > 0 and 0 <= r["acceptance"] <= 1, r
    assert "| banana | hmc |" in proc.stdout and "|---" in proc.stdout


@pytest.mark.slow
def test_first_call_times_both_cache_states_in_fresh_processes():
    records, _ = smoke("first_call")
    ours = [r for r in records if r.get("impl") == "ensemblenn"]
    assert sorted(r["cache"] for r in ours) == ["cold", "warm"]
    # Each figure is a fresh process's call, compilation included: never zero.
    assert all(r["first_call_s_min"] > 0 and r["compile_s_min"] > 0 for r in ours)
    assert all(r["first_call_s_min"] <= r["first_call_s_median"] for r in ours)


def test_kernels_parser_counts_a_step_loop():
    """`benchmarks.kernels` counts what runs per iteration of the outermost loop: fusions
    and other kernels, a nested loop's body and condition once, free ops not at all."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.kernels import count, parse_hlo

    text = """HloModule m

%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%inner_body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  ROOT %t = (s32[], f32[4]) tuple(%i, %f)
}

%inner_cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  ROOT %c = pred[] compare(%a, %b), direction=LT
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %c1 = f32[4]{0} copy(%x)
  %w = (s32[], f32[4]) while(%p), condition=%inner_cond, body=%inner_body
  %g = f32[16]{0} all-gather(f32[4]{0} %c1), dimensions={0}
  ROOT %t = (s32[], f32[4]) tuple(%i, %c1)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  ROOT %c = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %w = (s32[], f32[4]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""
    computations = parse_hlo(text)
    # body: copy, all-gather, the inner loop (fusion + compare); cond: compare.
    assert count(computations, "body") == (4, 1)
    assert count(computations, "cond") == (1, 0)
    assert count(computations, "main") == (5, 2)


@pytest.mark.slow
def test_smc_resampling_rows_and_peer():
    records, stdout = smoke("smc")
    rows = {(r.get("part"), r.get("impl")): r for r in records}
    for scheme in ("systematic", "stratified", "multinomial", "residual"):
        assert rows[("resampling", f"resample {scheme}")]["status"] == "ok"
    # The raw all-gather is what `resample` does, and the neighbour exchange moves the
    # same particles: both are checked bit for bit inside the benchmark.
    assert rows[("resampling", "raw all_gather (systematic)")]["note"].endswith("True")
    assert "same bits: True" in rows[("resampling", "raw neighbours (systematic)")]["note"]
    ours = rows[("smc", "ensemblenn")]
    assert ours["status"] == "ok" and ours["stages"] >= 1 and ours["log_z_se"] > 0
    peer = rows[("smc", "blackjax")]
    assert peer["status"] == ("ok" if installed("blackjax") else "skipped"), peer
    assert "## smc" in stdout


@pytest.mark.slow
def test_workflow_times_a_numpyro_model_end_to_end_in_fresh_processes():
    """Our side only (NumPyro's side is the same code path with another child): a cold and
    a warm process each, with their walls and the minimum ESS of the model's sites."""
    records, stdout = run_benchmark(
        "workflow", "--devices", "2", "--skip-peer", "--models", "eight_schools",
        "--chains", "8", "--warmup", "10", "--steps", "10",
    )  # fmt: skip
    rows = {r["cache"]: r for r in records if r.get("impl") == "ensemblenn"}
    assert set(rows) == {"cold", "warm"} and "## workflow" in stdout
    for row in rows.values():
        assert row["status"] == "ok" and row["draws"] == "8 x 10" and row["min_ess"] > 0
        assert row["wall_s_min"] > 0 and row["s_per_kess_min"] > 0


def test_workflow_radon_model_is_the_hierarchical_tests_model():
    """The workflow benchmark's NumPyro radon model has the log density of the tests'
    `RadonLike` (same unconstrained coordinates, up to a constant), so its timings are of
    the posterior the tests check against their reference."""
    pytest.importorskip("numpyro")
    import jax
    import numpy as np
    from numpyro.infer.util import potential_energy

    sys.path.insert(0, str(ROOT / "tests" / "samplers" / "models"))
    from hierarchical_models import RadonLike

    from benchmarks.workflow import problem

    model, args, sites = problem("radon_like")
    ours = RadonLike()
    gaps = []
    for key in range(3):
        u = 0.5 * jax.random.normal(jax.random.key(key), (ours.dim,))
        sizes = ours.site_sizes()
        parts = np.split(np.asarray(u), np.cumsum(list(sizes.values()))[:-1])
        params = {name: part if sizes[name] > 1 else part[0] for name, part in zip(sizes, parts)}
        assert tuple(params) == sites
        gaps.append(float(potential_energy(model, args, {}, params)) + float(ours(u)))
    assert np.ptp(gaps) < 1e-2, gaps  # float32 sums over 745 houses: ~1e-3 apart
