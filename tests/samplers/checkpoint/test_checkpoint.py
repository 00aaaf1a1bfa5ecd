"""Checkpoint and resume of `samplers.run`: bitwise continuation, atomic saves, clear errors."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers import checkpoint
from tests.interrupt import Interrupt, after_save, before_rename

PROGRAM = Path(__file__).parents[2] / "programs" / "checkpoint_run.py"
RUN = dict(
    num_chains=8, dim=3, num_steps=40, num_warmup=10, thin=5, chunk_size=10, checkpoint_every=30
)


def make_run(sampler=None):
    """The run every test here (and programs/checkpoint_run.py) continues or compares."""
    target = samplers.targets.IllConditionedGaussian(dim=RUN["dim"], condition_number=4.0)
    positions = jax.random.normal(jax.random.key(3), (RUN["num_chains"], RUN["dim"]))
    kwargs = dict(
        key=jax.random.key(11),
        num_steps=RUN["num_steps"],
        num_warmup=RUN["num_warmup"],
        thin=RUN["thin"],
        chunk_size=RUN["chunk_size"],
        track_bias=True,
        superchain_size=4,
        progress=False,
    )
    return sampler or samplers.MALA(step_size=0.5), target, positions, kwargs


def outcome(result):
    """Everything a resumed run must reproduce, as host arrays."""
    return {
        "position": np.asarray(result.state.position),
        "mean": np.asarray(result.moments.mean),
        "m2": np.asarray(result.moments.m2),
        "second": np.asarray(result.moments.second_moment),
        "trace": np.asarray(result.trace),
        "bias": np.asarray(result.bias_history),
        "acceptance": np.asarray(result.acceptance_rate),
        "rhat": np.asarray(result.diagnostics.rhat),
        "ess": np.asarray(result.diagnostics.ess),
    }


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run on the 4 test devices."""
    sampler, target, positions, kwargs = make_run()
    return outcome(samplers.run(sampler, target, positions, **kwargs))


def interrupted_run(monkeypatch, folder, *, after_step, sampler=None, **extra):
    """Run with checkpoints and stop right after the save at `after_step` (a preemption)."""
    sampler, target, positions, kwargs = make_run(sampler)
    with pytest.raises(Interrupt) as info:
        samplers.run(sampler, target, positions, checkpoint_dir=folder, **extra, **kwargs,
                     on_chunk=after_save(folder, after_step))  # fmt: skip
    # The run gave the folder's lock back itself, not when its frames are collected: `info`
    # keeps them alive here, as a notebook's last traceback does.
    assert info.traceback and not (Path(folder) / checkpoint.LOCKNAME).exists()


def test_resume_in_process_is_bitwise(tmp_path, monkeypatch, reference):
    interrupted_run(monkeypatch, tmp_path, after_step=30, checkpoint_every=15)
    header = checkpoint.inspect(tmp_path)
    assert header["step"] == 30 and header["total_steps"] == 50
    assert header["num_draws"] == 4  # sampling steps 10..29, every 5th kept
    sampler, target, positions, kwargs = make_run()
    result = samplers.run(
        sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs
    )
    for name, expected in reference.items():
        np.testing.assert_array_equal(outcome(result)[name], expected, err_msg=name)
    assert checkpoint.inspect(tmp_path)["step"] == 50

    # A complete checkpoint resumes to the same result without stepping again.
    again = samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)
    for name, expected in reference.items():
        np.testing.assert_array_equal(outcome(again)[name], expected, err_msg=name)


class HalveStepSize(samplers.Adaptation):
    """A cheap ensemble adaptation: step size from a cross-chain mean (an array field)."""

    def run(self, sampler, logdensity, state, key):
        spread = enn.chain_mean(jnp.abs(state.position).mean())
        tuned = eqx.tree_at(lambda s: s.step_size, sampler, 0.25 + 0.0 * spread)
        return tuned, state, {"step_size": tuned.step_size}


def test_resume_after_adaptation_restores_the_tuned_sampler(tmp_path, monkeypatch):
    sampler, target, positions, kwargs = make_run()
    straight = samplers.run(sampler, target, positions, adaptation=HalveStepSize(), **kwargs)
    interrupted_run(monkeypatch, tmp_path, after_step=0, adaptation=HalveStepSize())
    assert checkpoint.inspect(tmp_path)["step"] == 0  # saved right after adaptation
    resumed = samplers.run(
        sampler,
        target,
        positions,
        adaptation=HalveStepSize(),
        checkpoint_dir=tmp_path,
        resume=True,
        **kwargs,
    )
    assert isinstance(resumed.sampler, samplers.MALA)
    assert float(resumed.sampler.step_size) == 0.25
    assert float(resumed.adaptation_info["step_size"]) == 0.25
    for name, expected in outcome(straight).items():
        np.testing.assert_array_equal(outcome(resumed)[name], expected, err_msg=name)


def test_checkpoint_of_another_sampler_is_a_clear_error(tmp_path, monkeypatch):
    interrupted_run(monkeypatch, tmp_path, after_step=10, checkpoint_every=10)
    _, target, positions, kwargs = make_run()
    with pytest.raises(checkpoint.CheckpointMismatchError) as err:
        samplers.run(
            samplers.RandomWalk(step_size=0.5),
            target,
            positions,
            checkpoint_dir=tmp_path,
            resume=True,
            **kwargs,
        )
    message = str(err.value)
    assert "'MALA' in the checkpoint, 'RandomWalk' in this run" in message
    assert isinstance(err.value, enn.EnsembleError) and "fix:" in message

    # Same class, other hyperparameters; other step counts; another key.
    with pytest.raises(checkpoint.CheckpointMismatchError, match="hyperparameters differ"):
        samplers.run(
            samplers.MALA(step_size=0.4),
            target,
            positions,
            checkpoint_dir=tmp_path,
            resume=True,
            **kwargs,
        )
    with pytest.raises(checkpoint.CheckpointMismatchError, match="num_steps: 40 in the"):
        samplers.run(
            samplers.MALA(step_size=0.5),
            target,
            positions,
            checkpoint_dir=tmp_path,
            resume=True,
            **{**kwargs, "num_steps": 80},
        )
    with pytest.raises(checkpoint.CheckpointMismatchError, match="the key differ"):
        samplers.run(
            samplers.MALA(step_size=0.5),
            target,
            positions,
            checkpoint_dir=tmp_path,
            resume=True,
            **{**kwargs, "key": jax.random.key(12)},
        )
    # another block size would change the last bits, so it is another run too
    with pytest.raises(checkpoint.CheckpointMismatchError, match="block_size: None in the"):
        samplers.run(
            samplers.MALA(step_size=0.5),
            target,
            positions,
            checkpoint_dir=tmp_path,
            resume=True,
            **{**kwargs, "block_size": "auto"},
        )


def test_trace_rows_of_another_width_are_a_clear_error(tmp_path, monkeypatch):
    # A checkpoint written by a version whose trace rows held another set of statistics
    # (before `lp` was recorded: one fewer): a CheckpointError, not a broadcasting error.
    from samplers.driver import _loop  # private: the statistics this version writes

    interrupted_run(monkeypatch, tmp_path, after_step=30, checkpoint_every=10)
    sampler, target, positions, kwargs = make_run()
    monkeypatch.setattr(_loop, "TRACE_STATS", (*_loop.TRACE_STATS, ("other", "other")))
    with pytest.raises(checkpoint.CheckpointError) as err:
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)
    message = str(err.value)
    assert "rows of 11 numbers where this run writes 12" in message, message
    assert "another version" in message and "fix:" in message
    assert not (tmp_path / checkpoint.LOCKNAME).exists()  # the folder's lock given back


def test_existing_checkpoint_needs_resume_and_bad_arguments_are_errors(tmp_path, monkeypatch):
    interrupted_run(monkeypatch, tmp_path, after_step=10, checkpoint_every=10)
    sampler, target, positions, kwargs = make_run()
    with pytest.raises(checkpoint.CheckpointError, match="pass resume=True"):
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, **kwargs)
    with pytest.raises(checkpoint.CheckpointError, match="need a checkpoint_dir"):
        samplers.run(sampler, target, positions, resume=True, **kwargs)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint_every must be"):
        samplers.run(
            sampler, target, positions, checkpoint_dir=tmp_path, checkpoint_every=0, **kwargs
        )
    with pytest.raises(checkpoint.CheckpointError, match="inside jax.jit"):  # traced inputs
        checkpoint.open_run(
            tmp_path,
            None,
            True,
            traced=True,
            key=kwargs["key"],
            sampler=sampler,
            adaptation=None,
            logdensity=target,
            positions=positions,
            num_steps=40,
            num_warmup=10,
            thin=5,
            track_bias=True,
        )


def test_corrupt_or_foreign_files_are_clear_errors(tmp_path, monkeypatch):
    interrupted_run(monkeypatch, tmp_path, after_step=10, checkpoint_every=10)
    path = tmp_path / checkpoint.FILENAME
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0xFF  # one flipped bit in the last array
    path.write_bytes(bytes(blob))
    sampler, target, positions, kwargs = make_run()
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)
    path.write_bytes(bytes(blob[: len(blob) // 2]))  # truncated
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        checkpoint.inspect(tmp_path)
    path.write_bytes(b"\x80\x04K\x01.")  # a pickle is not a checkpoint, and is never loaded
    with pytest.raises(checkpoint.CheckpointError, match="not a samplers checkpoint"):
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint._storage.write_atomic(tmp_path / "f", b"old contents")
    old = (tmp_path / "f").read_bytes()

    def fail(path):
        assert path.exists() and path.name.startswith(".f.tmp-")
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", before_rename(fail))
    with pytest.raises(OSError):
        checkpoint._storage.write_atomic(tmp_path / "f", b"new contents, never complete")
    assert (tmp_path / "f").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # the temp file is gone

    # In a run: the failed save is a CheckpointError and the previous checkpoint stays.
    calls = []

    def fail_second(path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")

    monkeypatch.setattr(os, "replace", before_rename(fail_second))
    sampler, target, positions, kwargs = make_run()
    with pytest.raises(checkpoint.CheckpointError, match="disk full"):
        samplers.run(
            sampler,
            target,
            positions,
            checkpoint_dir=tmp_path / "run",
            checkpoint_every=10,
            **kwargs,
        )
    assert checkpoint.inspect(tmp_path / "run")["step"] == 10


@pytest.mark.slow
def test_sigkill_mid_write_then_resume_elsewhere(tmp_path, reference):
    """A save killed mid-write leaves the previous checkpoint. Other processes resume from
    it: this one (4 devices) bitwise, a fresh one on 2 devices to 1e-6."""
    folder = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), "4", str(folder), "kill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROGRAM.parent,
    )
    try:
        deadline = time.monotonic() + 240
        line = ""
        while "MIDWRITE" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"the run ended before its mid-write pause:\n{proc.stderr.read()}")
            assert time.monotonic() < deadline, "no mid-write pause within 240 s"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    names = sorted(p.name for p in folder.iterdir())
    assert names[0].startswith(".checkpoint.enn.tmp-")
    assert names[1:] == ["checkpoint.enn", "checkpoint.lock"]  # the killed run's lock
    assert checkpoint.inspect(folder)["step"] == RUN["checkpoint_every"]  # the previous one

    other = tmp_path / "ckpt2"
    shutil.copytree(folder, other)
    two = subprocess.Popen(
        [sys.executable, str(PROGRAM), "2", str(other), "resume", str(tmp_path / "two.npz")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=PROGRAM.parent,
    )
    try:
        sampler, target, positions, kwargs = make_run()
        with pytest.warns(UserWarning, match="no longer running"):  # the stale lock
            resumed = samplers.run(
                sampler, target, positions, checkpoint_dir=folder, resume=True, **kwargs
            )
        same = outcome(resumed)
        _, err = two.communicate(timeout=240)
    finally:
        if two.poll() is None:
            two.kill()
            two.wait()
    assert two.returncode == 0, err
    two = np.load(tmp_path / "two.npz")
    for name, expected in reference.items():
        np.testing.assert_array_equal(same[name], expected, err_msg=name)
        np.testing.assert_allclose(two[name], expected, rtol=1e-6, atol=1e-6, err_msg=name)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # stale temp removed
    assert not (folder / checkpoint.LOCKNAME).exists()  # the finished run gave it back


@pytest.mark.slow
def test_cli_checkpoint_resume_plot_and_json(tmp_path):
    """`python -m samplers run --checkpoint DIR [--resume] --out DIR` at a tiny size."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    base = [
        sys.executable,
        "-m",
        "samplers",
        "run",
        "--target",
        "gaussian",
        "--dim",
        "3",
        "--sampler",
        "mala",
        "--adaptation",
        "none",  # 10 plain warmup steps, so the checkpoint ends at step 30
        "--chains",
        "8",
        "--steps",
        "20",
        "--warmup",
        "10",
        "--devices",
        "2",
        "--no-progress",
        "--checkpoint",
        str(ckpt),
    ]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}

    def cli(*extra):
        return subprocess.run(
            base + list(extra), capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
        )

    first = cli("--out", str(out))
    assert first.returncode == 0, first.stderr
    report = json.loads((out / "diagnostics.json").read_text())
    assert report["devices"] == 2 and report["checkpoint"] == str(ckpt)
    assert len(report["rhat"]) == 3 and report["resumed_from_step"] is None
    try:
        import matplotlib  # noqa: F401

        assert report["plot"] == "convergence.png"
        assert (out / "convergence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    except ImportError:
        assert report["plot"] is None and "matplotlib" in report["plot_note"]
    assert checkpoint.inspect(ckpt)["step"] == 30

    saved_seconds = checkpoint.inspect(ckpt)["wall_seconds"]
    assert 0 < saved_seconds <= report["wall_seconds"]
    again = cli("--out", str(tmp_path / "out2"), "--resume")  # complete: loads, no steps
    assert again.returncode == 0, again.stderr
    assert "resuming from the checkpoint at step 30" in again.stdout
    resumed = json.loads((tmp_path / "out2" / "diagnostics.json").read_text())
    assert resumed["resumed_from_step"] == 30
    assert resumed["wall_seconds"] >= saved_seconds  # the whole run's, not the resumed part
    for name in ("rhat", "nested_rhat", "ess", "bias_squared_max", "acceptance_rate"):
        assert resumed[name] == report[name], name

    clash = cli()  # no --resume, no --out (so no b² tracking): refuses to overwrite
    assert clash.returncode == 2 and "already holds a checkpoint" in clash.stderr


def test_a_flipped_bit_in_the_header_is_caught(tmp_path, monkeypatch):
    """The digest covers the header: a step of 10 turned into 11 is still valid JSON, and
    resuming from it would silently skip a step and give a wrong result."""
    interrupted_run(monkeypatch, tmp_path, after_step=10, checkpoint_every=10)
    path = tmp_path / checkpoint.FILENAME
    blob = bytearray(path.read_bytes())
    at = blob.index(b'"step": 10') + len(b'"step": 1')
    blob[at] ^= 0x01  # "0" -> "1"
    path.write_bytes(bytes(blob))
    header = checkpoint._format._header(bytes(blob), len(checkpoint._format.MAGIC) + 8)
    assert header["step"] == 11  # the header alone still reads fine
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        checkpoint.inspect(tmp_path)
    sampler, target, positions, kwargs = make_run()
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)


def _lock_held_by(folder, pid, host=None):
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"pid": pid, "host": host or socket.gethostname(), "since": time.time()}
    (folder / checkpoint.LOCKNAME).write_text(json.dumps(holder))


def test_a_second_run_on_the_same_folder_is_refused_at_start(tmp_path):
    """A real second process holds the folder: this run fails before any step, naming the
    folder, the holder's PID and host, and the fix; once the holder is gone the lock is
    stale and taken over with a warning."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # private: a second process holding the run lock, as a concurrent run would
            "import sys, time; from samplers.checkpoint._lock import RunLock; "
            "lock = RunLock(sys.argv[1]); lock.acquire(); print('LOCKED', flush=True); "
            "time.sleep(120)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        sampler, target, positions, kwargs = make_run()
        with pytest.raises(checkpoint.CheckpointError) as err:
            samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, **kwargs)
        message = str(err.value)
        for part in (str(tmp_path), f"process {holder.pid}", socket.gethostname(), "fix:"):
            assert part in message, part
        assert not (tmp_path / checkpoint.FILENAME).exists()  # refused before any save
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The holder died without giving the lock back: stale, taken over with a warning.
    with pytest.warns(UserWarning, match=f"from process {holder.pid} .* no longer running"):
        samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, **kwargs)
    assert not (tmp_path / checkpoint.LOCKNAME).exists()  # the finished run gave it back
    assert checkpoint.inspect(tmp_path)["step"] == 50


def test_lock_held_by_a_live_process_or_another_host_is_an_error(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_held_by(tmp_path / "a", sleeper.pid)  # alive, on this host
        with pytest.raises(checkpoint.CheckpointError, match="that process is running"):
            checkpoint.Checkpointer(tmp_path / "a", every=None, resume=True, fingerprint={})
    finally:
        sleeper.kill()
        sleeper.wait()
    _lock_held_by(tmp_path / "b", 1, host="another-host.example")  # cannot be checked
    with pytest.raises(checkpoint.CheckpointError, match="on another host") as err:
        checkpoint.Checkpointer(tmp_path / "b", every=None, resume=True, fingerprint={})
    assert "another-host.example" in str(err.value) and "delete" in str(err.value)
    # An interrupted run of this process left its lock: the next run here takes it over.
    _lock_held_by(tmp_path / "c", os.getpid())
    store = checkpoint.Checkpointer(tmp_path / "c", every=None, resume=True, fingerprint={})
    store.close()
    assert not (tmp_path / "c" / checkpoint.LOCKNAME).exists()


def test_wall_seconds_add_up_across_resumes(tmp_path, monkeypatch):
    """A resumed run's wall time includes the time of the run it continues."""
    save = checkpoint.Checkpointer.save

    def slow_save_then_stop(self, snapshot, total):
        time.sleep(1.0)  # the first run takes at least a second before it saves
        save(self, snapshot, total)
        raise Interrupt

    monkeypatch.setattr(checkpoint.Checkpointer, "save", slow_save_then_stop)
    sampler, target, positions, kwargs = make_run()
    with pytest.raises(Interrupt):
        samplers.run(
            sampler, target, positions, checkpoint_dir=tmp_path, checkpoint_every=30, **kwargs
        )
    monkeypatch.setattr(checkpoint.Checkpointer, "save", save)
    first = checkpoint.inspect(tmp_path)["wall_seconds"]
    assert first >= 1.0
    tick = time.perf_counter()
    samplers.run(sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs)
    resumed_part = time.perf_counter() - tick
    total = checkpoint.inspect(tmp_path)["wall_seconds"]
    assert first < total <= first + resumed_part
    assert total > resumed_part  # not only the resumed part


class ScaleStep(samplers.Adaptation):
    """A trivial adaptation with one setting (for the fingerprint's adaptation fields)."""

    factor: float = 1.0

    def run(self, sampler, logdensity, state, key):
        return sampler, state, None


def _base_config():
    sampler, target, positions, kwargs = make_run()
    return dict(
        sampler=sampler,
        adaptation=ScaleStep(1.0),
        logdensity=target,
        positions=positions,
        key=kwargs["key"],
        num_steps=RUN["num_steps"],
        num_warmup=RUN["num_warmup"],
        thin=RUN["thin"],
        track_bias=True,
        block_size="auto",
    )


# For every fingerprint field, a change of the run's configuration that only it records.
CHANGES = {
    "sampler": dict(sampler=samplers.RandomWalk(step_size=0.5)),
    "adaptation": dict(adaptation=HalveStepSize()),
    "target": dict(logdensity=samplers.targets.Banana()),
    "num_chains": dict(positions=jnp.zeros((16, RUN["dim"]))),
    "dim": dict(positions=jnp.zeros((RUN["num_chains"], RUN["dim"] + 1))),
    "dtype": dict(positions=jnp.zeros((RUN["num_chains"], RUN["dim"]), jnp.bfloat16)),
    "num_steps": dict(num_steps=RUN["num_steps"] + 1),
    "num_warmup": dict(num_warmup=RUN["num_warmup"] + 1),
    "thin": dict(thin=None),
    "track_bias": dict(track_bias=False),
    "block_size": dict(block_size=None),
    "sampler_config": dict(sampler=samplers.MALA(step_size=0.4)),
    "adaptation_config": dict(adaptation=ScaleStep(2.0)),
    "target_config": dict(
        logdensity=samplers.targets.IllConditionedGaussian(dim=RUN["dim"], condition_number=8.0)
    ),
    "initial_positions": "shifted",  # the same shape and dtype, other values
    "key": dict(key=jax.random.key(12)),
}
HIDDEN = {
    "sampler_config": "the sampler's hyperparameters differ",
    "adaptation_config": "the adaptation's settings differ",
    "target_config": "the target (its parameters or data) differ",
    "initial_positions": "the initial positions differ",
    "key": "the key differ",
}


def test_every_fingerprint_field_is_covered():
    assert set(CHANGES) == set(checkpoint.fingerprint(**_base_config()))


class Reached(Exception):
    pass


def _restore(folder, config):
    def prepare():
        raise Reached  # the fingerprint matched: restoring goes on to build its template

    store = checkpoint.open_run(folder, None, True, traced=False, **config)
    try:
        return store.restore(prepare, jax.random.split(jax.random.key(0), 8))
    finally:
        store.close()


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_resume_with_any_fingerprint_field_changed_is_a_mismatch(tmp_path, field):
    base = _base_config()
    store = checkpoint.open_run(tmp_path, None, False, traced=False, **base)
    store.save(
        checkpoint.Snapshot(10, None, {"x": jnp.zeros((8, 3))}, None, jnp.zeros(8), None, None),
        total=50,
    )
    with pytest.raises(Reached):  # the same configuration is no mismatch
        _restore(tmp_path, base)
    change = CHANGES[field]
    if change == "shifted":
        change = dict(positions=base["positions"] + 1.0)
    with pytest.raises(checkpoint.CheckpointMismatchError) as err:
        _restore(tmp_path, {**base, **change})
    expected = HIDDEN.get(field, f"  {field}: ")
    assert expected in str(err.value)


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_resume_on_the_accelerator_trace_layout_is_bitwise(tmp_path, monkeypatch, platform):
    """On an accelerator the trace buffer is flat, its rows padded to TPU tiles (and on a
    GPU with a scratch row): the checkpoint's rows are read out of it and written back
    into a fresh one on resume (the platform is patched: no accelerator in CI)."""
    monkeypatch.setattr(enn, "mesh_platform", lambda *args, **kw: platform)
    sampler, target, positions, kwargs = make_run()
    expected = outcome(samplers.run(sampler, target, positions, **kwargs))
    interrupted_run(monkeypatch, tmp_path, after_step=30, checkpoint_every=15)
    assert checkpoint.inspect(tmp_path)["num_draws"] == 4
    result = samplers.run(
        sampler, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs
    )
    for name, value in expected.items():
        np.testing.assert_array_equal(outcome(result)[name], value, err_msg=name)
    assert expected["trace"].shape == (8, 8, 3)  # 40 sampling steps, every 5th kept
