"""`python -m samplers run`: errors as one line (exit 2), --strict, Ctrl-C, tuned defaults."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import samplers.cli
from samplers.cli import _main  # private: the parser and its argument checks, tested directly
from samplers.cli._kernels import SAMPLERS  # private: the --sampler names, one test each

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
ENV["PYTHONPATH"] = str(ROOT) + os.pathsep + ENV.get("PYTHONPATH", "")


def cli(*args, timeout=240, **kwargs):
    return subprocess.run([sys.executable, "-m", "samplers", "run", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV, **kwargs)  # fmt: skip


@pytest.mark.parametrize(
    "args, says",
    [
        (["--chains", "0"], "--chains must be >= 1, got 0"),
        (["--chains", "-4"], "--chains must be >= 1, got -4"),
        (["--chains", "6", "--devices", "4"], "--chains 6 is not a multiple of --devices 4"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--warmup", "-5"], "--warmup must be >= 0, got -5"),
        (["--devices", "0"], "--devices must be >= 1, got 0"),
        (["--dim", "0"], "--dim must be >= 1, got 0"),
        (["--target", "banana", "--dim", "3"], "--target banana is 2-d"),
        (["--target", "rosenbrock", "--dim", "5"], "needs an even --dim"),
        (["--superchain-size", "3", "--chains", "8"], "--superchain-size 3 must divide"),
        (["--resume"], "--resume needs --checkpoint DIR"),
        (["--target", "nope"], "argument --target: invalid choice: 'nope'"),
        (["--chains", "many"], "argument --chains: invalid int value: 'many'"),
        (["--block-size", "-1"], "block size must be >= 0"),
        (["--sampler", "rwm", "--metric", "dense"], "--sampler rwm takes a diagonal metric only"),
        (["--sampler", "rwm", "--metric", "gradient"], "--sampler rwm computes no gradients"),
        (["--sampler", "laps", "--metric", "dense"], "tuned by LAPS's own rules"),
        (["--metric", "full"], "argument --metric: invalid choice: 'full'"),
    ],
)
def test_a_bad_argument_is_one_error_line_and_exit_2(args, says, capsys):
    # In this process (a fresh one per case cost ~3 s of imports each); the test below runs
    # the real command line for an argparse error and for one of ours.
    try:
        code = samplers.cli.main(["run", *args])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize(
    "args, says",
    [
        (["--chains", "many"], "argument --chains: invalid int value: 'many'"),
        (["--chains", "6", "--devices", "4"], "--chains 6 is not a multiple of --devices 4"),
    ],
)
def test_a_bad_argument_exits_the_process_with_2_and_one_line(args, says):
    done = cli(*args, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_the_help_shows_defaults_and_explains_flags():
    text = " ".join(
        _main.parser()._subparsers._group_actions[0].choices["run"].format_help().split()
    )
    for flag in ("--adaptation", "--strict", "--no-cache", "--superchain-size", "--warmup",
                 "--metric", "--explain"):  # fmt: skip
        assert flag in text
    assert "(default: laps)" in text and "(default: 256)" in text and "WindowAdaptation" in text
    assert "nuts" in text and "Neal's funnel" in text  # samplers and targets explained
    # Defaults stated in words are not followed by argparse's own "(default: None)".
    for flag, after in (("--dim DIM", "--sampler"), ("--superchain-size K", "--strict")):
        said = text.rsplit(flag, 1)[1].split(after)[0]  # the options list, not the usage
        assert "(default: " in said and "(default: None)" not in said, said


def test_check_arguments_and_superchains_without_jax():
    args = _main.parser().parse_args(["run", "--chains", "64"])
    assert _main.check_arguments(args) is None and _main.superchain_size(args) == 4
    args = _main.parser().parse_args(["run", "--chains", "8", "--devices", "2"])
    assert _main.superchain_size(args) is None  # too few chains for 8 superchains of 2
    args = _main.parser().parse_args(["run", "--chains", "64", "--superchain-size", "0"])
    # 0 reaches samplers.run, which then uses no superchains (None would pick them).
    assert _main.check_arguments(args) is None and _main.superchain_size(args) == 0


def test_metric_auto_is_dense_up_to_100_dimensions_for_one_step_kernels():
    from samplers.cli._kernels import make_sampler  # private: what each --metric picks

    for name in ("mala", "hmc", "ghmc", "nuts"):
        assert make_sampler(name, True, 100, "dense", 10)[1].metric == "dense"
        assert make_sampler(name, True, 100, "gradient", 101)[1].metric == "gradient"
        assert make_sampler(name, True, 100, "none", 10)[1].metric is None
    for name in ("mala", "ghmc"):  # one gradient step per transition
        _, adaptation, described = make_sampler(name, True, 100, "auto", 100)
        assert adaptation.metric == "dense" and "dense metric" in described
        assert make_sampler(name, True, 100, "auto", 101)[1].metric == "diagonal"
    for name in ("rwm", "hmc", "nuts", "adjusted-mclmc"):
        assert make_sampler(name, True, 100, "auto", 10)[1].metric == "diagonal"
    assert "per-coordinate" in make_sampler("rwm", True, 100, "auto", 10)[2]
    args = _main.parser().parse_args(["run", "--sampler", "nuts", "--metric", "gradient"])
    assert _main.check_arguments(args) is None


TINY = ["--target", "gaussian", "--dim", "3", "--chains", "8", "--steps", "10", "--warmup",
        "0", "--devices", "4", "--no-progress", "--no-cache"]  # fmt: skip


def test_strict_exits_1_when_not_converged(capsys):
    assert samplers.cli.main(["run", *TINY, "--sampler", "mala", "--strict"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("verdict: NOT CONVERGED: ")
    assert "target   gaussian (d=3)" in out and "of 80 sampling draws" in out
    # The legend is --explain's (tests/samplers/driver/test_hints.py); 8 chains: no
    # superchains, so no nested R-hat column.
    assert "how to read it:" not in out and "R-hat (nested)" not in out
    assert samplers.cli.main(["run", *TINY, "--sampler", "mala"]) == 0  # the same, not strict


def test_a_library_error_is_one_line(tmp_path):
    # The flags are fine; the library refuses to overwrite an existing checkpoint.
    first = cli(*TINY, "--sampler", "rwm", "--checkpoint", str(tmp_path))
    assert first.returncode == 0, first.stderr
    again = cli(*TINY, "--sampler", "rwm", "--checkpoint", str(tmp_path))
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr
    assert lines[0].startswith("error: ") and "already holds a checkpoint" in lines[0]


def _interrupt(args, ready):
    """Start a long CLI run, wait until `ready()` holds, send SIGINT, return its outcome."""
    command = [sys.executable, "-m", "samplers", "run", *args]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        while not ready() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out, err


# About two minutes of sampling (~10 us per step): long after the 20 s at which the test
# without a checkpoint interrupts, even when every program comes from the compilation cache.
LONG = ["--target", "gaussian", "--dim", "20", "--chains", "16", "--steps", "10000000",
        "--warmup", "0", "--sampler", "mala", "--devices", "2", "--no-progress",
        "--no-cache"]  # fmt: skip


def test_ctrl_c_with_a_checkpoint_keeps_the_save_and_says_resume(tmp_path):
    from samplers import checkpoint

    saved = tmp_path / checkpoint.FILENAME
    code, _, err = _interrupt([*LONG, "--checkpoint", str(tmp_path)], saved.exists)
    assert code == 130 and "Traceback" not in err, err
    step = checkpoint.inspect(tmp_path)["step"]
    assert step > 0
    # The interrupted run gave the folder's lock back: a --resume takes it without a warning.
    assert not (tmp_path / checkpoint.LOCKNAME).exists()
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted at step ") and line.endswith(
        f"the checkpoint holds step {step}: rerun with --resume"
    ), err


def test_ctrl_c_without_a_checkpoint():
    # Nothing to poll without blocking: interrupt 20 s in (imported, compiled, sampling).
    start = time.monotonic()
    code, _, err = _interrupt(LONG, lambda: time.monotonic() - start > 20)
    assert code == 130 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted") and "resume" not in line, err


# Measured (jax 0.10.2, 4 CPU devices): all 16 combinations converge with the defaults at
# 400 warmup + 400 sampling steps (mala on the gaussian since MALA takes WindowAdaptation's
# metric, dense at 10-d with --metric auto), except the random walk: it needs O(d)
# steps per independent draw (nested R-hat 1.017 after 400 steps), so it is tested at a
# size that is still modest for a random walk, 1000 warmup + 2000 sampling steps (nested
# R-hat 1.004 on both targets, min ESS 2756 and 2830; at 500 + 1000 it was 1.007, too close
# to 1.01 to keep). The random walk's steps are cheap (no gradient), so CI time stays small.
_SIZE = {"rwm": ("2000", "1000")}  # sampler: (--steps, --warmup); the others ("400", "400")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sampler", "target"), [(s, t) for t in ("gaussian", "logistic") for s in SAMPLERS]
)
def test_every_sampler_converges_with_defaults(sampler, target, capsys):
    dim = ["--dim", "10"] if target == "gaussian" else []
    steps, warmup = _SIZE.get(sampler, ("400", "400"))
    code = samplers.cli.main(["run", "--target", target, *dim, "--sampler", sampler,
                              "--chains", "64", "--steps", steps, "--warmup", warmup,
                              "--devices", "4", "--no-progress", "--no-cache",
                              "--strict"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out.splitlines()[-1]


# --- --sampler smc ------------------------------------------------------------------------

SMC = ["--sampler", "smc", "--devices", "4", "--no-progress", "--no-cache"]


def _printed(out: str, prefix: str) -> list[float]:
    """The numbers of the output line that starts with `prefix`."""
    import re

    line = next(line for line in out.splitlines() if line.startswith(prefix))
    return [float(v) for v in re.findall(r"-?\d+\.\d+", line)]


def test_smc_on_the_gaussian_converges_and_prints_log_z(capsys):
    code = samplers.cli.main(["run", *SMC, "--target", "gaussian", "--dim", "3", "--chains",
                              "256", "--strict"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1].startswith("verdict: CONVERGED"), out
    assert "256 particles on 4 device(s)" in out and "stages to temperature 1" in out
    log_z, se = _printed(out, "log Z    ")[:2]
    assert abs(log_z) < 4 * se, out  # the target and the prior are normalised: log Z = 0


@pytest.mark.slow  # 13 s on a loaded 2-core machine
def test_smc_recovers_the_bimodal_mode_weights(capsys):
    code = samplers.cli.main(["run", *SMC, "--target", "bimodal", "--dim", "3", "--chains",
                              "512"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    first, second, error = _printed(out, "modes    ")[:3]
    assert abs(second - 0.2) < max(4 * error, 0.02) and error < 0.05, out
    assert first + second == pytest.approx(1.0)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--sampler", "smc", "--adaptation", "none"], "--adaptation with --sampler smc"),
        (["--sampler", "smc", "--adaptation", "default"], "fix: leave out --adaptation"),
        (["--sampler", "smc", "--steps", "100"], "fix: --mutation-steps N instead"),
        (["--sampler", "smc", "--warm", "10"], "--warmup with --sampler smc"),
        (["--sampler", "smc", "--superchain-size", "4"], "fix: leave out --superchain-size"),
        (["--sampler", "smc", "--metric", "gradient"], "--metric gradient with --sampler smc"),
        (["--sampler", "smc", "--mutation-kernel", "rwm", "--metric", "dense"],
         "--mutation-kernel rwm takes a per-coordinate scale only"),
        (["--sampler", "smc", "--mutation-steps", "0"], "--mutation-steps must be >= 1"),
        (["--sampler", "nuts", "--mutation-steps", "3"],
         "--mutation-steps is a flag of --sampler smc, not of --sampler nuts"),
        (["--mutation-kernel", "mala"], "fix: --sampler smc, or leave out --mutation-kernel"),
    ],
)  # fmt: skip
def test_smc_bad_flags_are_one_error_line_with_a_fix(args, says, capsys):
    assert samplers.cli.main(["run", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], captured.err
    assert "fix: " in lines[0] and captured.out == ""


def test_smc_checkpoint_is_refused_again_and_resumed(tmp_path, capsys):
    args = ["run", *SMC, "--target", "gaussian", "--dim", "2", "--chains", "128",
            "--mutation-steps", "2", "--checkpoint", str(tmp_path)]  # fmt: skip
    assert samplers.cli.main(args) == 0
    first = _printed(capsys.readouterr().out, "log Z    ")[:2]
    assert samplers.cli.main(args) == 2  # the folder holds a finished run's checkpoint
    assert "holds a checkpoint" in capsys.readouterr().err
    assert samplers.cli.main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resuming from the checkpoint after stage" in out
    assert _printed(out, "log Z    ")[:2] == first  # nothing left to run: the same numbers
