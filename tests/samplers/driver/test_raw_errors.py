"""Mistakes that used to come out as raw Python errors (IndexError, FileExistsError,
NotADirectoryError, a CLI traceback), and the user's own exceptions, which used to come
out wrapped in a SamplerError.

A mistake is the library's own error, naming the argument, with a `fix:` line, raised
before anything compiles and without writing or removing a file. An exception raised by
the user's log density is re-raised as itself, with samplers.run's context as a note."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from samplers.checkpoint._store import check_dir  # private: the folder check alone
from samplers.driver import _run  # private: spied on to prove nothing started
from tests.compile_counter import counting

ROOT = Path(__file__).resolve().parents[3]
KEY = jax.random.key(0)
# Made here, so that each case's compile count sees only what samplers.run compiles.
POSITIONS = jnp.zeros((8, 2))
EMPTY = {
    "no coordinates": jnp.zeros((8, 0)),
    "no chains": jnp.zeros((0, 2)),
    "pytree of empty leaves": {"a": jnp.zeros((8, 0)), "b": jnp.zeros((8, 3, 0))},
}


class MyModelError(Exception):
    """A user's model's own exception."""


class Recording:
    """A log density that records each call (tracing included) and can raise."""

    def __init__(self, error: Exception | None = None):
        self.calls = 0
        self.error = error

    def __call__(self, x):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return -0.5 * jnp.sum(jax.tree.leaves(x)[0] ** 2)


@pytest.fixture
def setups(monkeypatch):
    """The run's setups begun (its first compiled programs); the compile count alone misses
    programs that an earlier test compiled in this process."""
    begun = []

    def make_setup(*args, **kwargs):
        begun.append(args)
        return real(*args, **kwargs)

    real = _run.make_setup
    monkeypatch.setattr(_run, "make_setup", make_setup)
    return begun


def run(logdensity, positions=POSITIONS, **kwargs):
    return samplers.run(samplers.MALA(step_size=0.5), logdensity, positions, key=KEY,
                        num_steps=5, progress=False, **kwargs)  # fmt: skip


def files(folder: Path) -> dict[str, bytes | None]:
    """Every path below `folder`, with the files' contents (None for a folder)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def has_fix_line(message: str) -> bool:
    return any(line.startswith("  fix: ") for line in message.splitlines())


@pytest.mark.parametrize("positions", EMPTY.values(), ids=EMPTY.keys())
def test_zero_size_positions_are_a_sampler_error_before_compiling(positions, setups):
    logdensity = Recording()
    with counting() as compiles, pytest.raises(samplers.SamplerError) as info:
        run(logdensity, positions)
    message = str(info.value)
    shapes = [np.shape(x) for x in jax.tree.leaves(positions)]
    assert message.startswith("positions has ") and str(shapes[-1]) in message, message
    assert has_fix_line(message), message
    assert len(compiles) == 0 and not setups, f"compiled {compiles.names} before raising"
    assert logdensity.calls == 0  # not even traced


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
@pytest.mark.parametrize("below", [False, True], ids=["a file", "below a file"])
def test_a_checkpoint_dir_that_cannot_be_a_folder_is_a_checkpoint_error(
    tmp_path, below, as_path, setups
):
    (tmp_path / "somefile").write_text("the user's data")
    folder = tmp_path / "somefile" / "run" if below else tmp_path / "somefile"
    before = files(tmp_path)
    with counting() as compiles, pytest.raises(samplers.CheckpointError) as info:
        run(Recording(), checkpoint_dir=as_path(folder))
    message = str(info.value)
    assert f"checkpoint_dir={str(folder)!r}" in message, message
    assert ("cannot be made" if below else "is a file, not a folder") in message, message
    assert has_fix_line(message), message
    assert len(compiles) == 0 and not setups, f"compiled {compiles.names} before raising"
    assert files(tmp_path) == before  # nothing written or removed


def test_check_dir_accepts_folders_and_paths_to_make_and_writes_nothing(tmp_path):
    for folder in (tmp_path, tmp_path / "new", tmp_path / "new" / "nested", Path("")):
        check_dir(folder)
        check_dir(str(folder))
    check_dir(None)  # no checkpoint
    assert files(tmp_path) == {}
    with pytest.raises(samplers.CheckpointError, match="must be a path, got int"):
        check_dir(3)


def test_cli_checkpoint_on_a_file_is_one_error_line_without_traceback(tmp_path):
    file = tmp_path / "somefile"
    file.write_text("the user's data")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "samplers", "run", "--target", "gaussian", "--sampler", "mala",
         "--chains", "8", "--steps", "10", "--checkpoint", str(file), "--no-cache"],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"checkpoint_dir={str(file)!r} is a file, not a folder" in lines[0], done.stderr
    assert "fix: " in lines[0]
    assert files(tmp_path) == {"somefile": b"the user's data"}


@pytest.mark.parametrize(
    "error",
    [MyModelError("the model's data is missing"), RuntimeError("data file missing"),
     ZeroDivisionError("division by zero")],
    ids=lambda e: type(e).__name__,
)  # fmt: skip
def test_the_logdensitys_own_exception_propagates_as_itself_with_a_note(error, setups):
    logdensity = Recording(error)
    with counting() as compiles, pytest.raises(type(error)) as info:
        run(logdensity)
    assert info.value is error  # not wrapped: `except MyModelError:` in user code catches it
    assert not isinstance(info.value, samplers.SamplerError)
    notes = [n for n in getattr(info.value, "__notes__", []) if "samplers.run" in n]
    assert len(notes) == 1 and "logdensity" in notes[0] and "(2,)" in notes[0], notes
    assert len(compiles) == 0 and not setups, f"compiled {compiles.names} before raising"


def test_user_code_catches_its_own_exception():
    def logdensity(x):
        raise MyModelError("bad parameters")

    try:
        run(logdensity)
    except MyModelError as err:
        caught = err
    assert "bad parameters" in str(caught)


def test_the_observables_own_exception_propagates_as_itself_with_a_note():
    class Target:
        def __call__(self, x):
            return -0.5 * jnp.sum(x**2)

        def observable(self, x):
            raise MyModelError("no observable here")

    with pytest.raises(MyModelError, match="no observable here") as info:
        run(Target())
    notes = [n for n in getattr(info.value, "__notes__", []) if "samplers.run" in n]
    assert len(notes) == 1 and "observable" in notes[0], notes


def test_what_the_library_detects_is_still_its_own_error():
    # A log density of all the chains at once (one term per coordinate): a SamplerError.
    with pytest.raises(samplers.SamplerError, match=r"must return a scalar") as info:
        run(lambda x: -0.5 * x**2)
    assert has_fix_line(str(info.value))
