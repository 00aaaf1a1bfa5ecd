"""The run's one progress bar: every phase, one rate, resumes at the saved step."""

import io

import jax
import jax.numpy as jnp
import pytest

import samplers
from samplers.driver._progress import Progress  # private: the bar, drawn into a buffer
from tests.interrupt import after_save

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
X0 = jax.random.normal(jax.random.key(0), (8, 3))


def frames(text: str) -> list[str]:
    return [f for f in text.replace("\r", "\n").splitlines() if f.strip()]


def test_phases_times_and_one_rate():
    out = io.StringIO()
    bar = Progress(100, enabled=True, file=out)
    with bar.phase("compiling") as produced:
        produced.append(jnp.ones(3) * 2)
    bar.advance(40, 0.5, 2.0, "warmup")
    bar.advance(60, jnp.float32(0.25), 1.0, "sampling")
    bar.close()
    shown = frames(out.getvalue())
    assert any("phase=compiling..." in f for f in shown)
    assert "compiling=" in shown[-1] and bar.timings["compiling"] >= 0.0
    last = shown[-1]
    assert "100/100" in last and "phase=sampling" in last and "acc=0.250" in last
    assert "rate=33.3 steps/s" in last  # 100 steps in 3 s: ONE rate, over executed steps
    assert all(f.count("/s") <= 1 for f in shown) and "it/s" not in out.getvalue()
    assert any("phase=warmup" in f and "eta=" in f for f in shown)


def test_resume_continues_from_the_saved_step():
    out = io.StringIO()
    bar = Progress(100, enabled=True, file=out)
    bar.start_at(60)
    bar.advance(40, 0.5, 4.0, "sampling")
    bar.close()
    shown = frames(out.getvalue())
    assert "60/100" in shown[0] and not any(" 0/100" in f for f in shown)
    assert "100/100" in shown[-1] and "rate=10.0 steps/s" in shown[-1]  # 40 steps / 4 s


def test_disabled_is_a_no_op():
    bar = Progress(10, enabled=False)
    with bar.phase("adapting") as produced:
        produced.append(jnp.ones(2))
    bar.start_at(3)
    bar.advance(10, 0.5, 1.0, "sampling")
    bar.close()
    assert bar.bar is None and bar.timings == {} and not bar.enabled


def test_a_run_shows_initialising_adapting_compiling_and_sampling(capsys):
    samplers.run(None, TARGET, X0, key=jax.random.key(1), num_steps=40, chunk_size=10,
                 adaptation=samplers.LAPS(num_steps1=30, num_adaptation_steps=6),
                 progress=True)  # fmt: skip
    shown = frames(capsys.readouterr().err)
    assert shown and all(f.startswith("ensemble") for f in shown)
    text = "\n".join(shown)
    for phase in ("initialising", "adapting", "compiling"):
        assert f"phase={phase}..." in text and f"{phase}=" in shown[-1], phase
    assert "76/76" in shown[-1] and "phase=sampling" in shown[-1] and "steps/s" in shown[-1]
    assert all(f.count("steps/s") <= 1 for f in shown)


def test_the_bar_advances_through_the_adaptation(capsys):
    """The adaptation's steps are on the bar (36 + 40), counted while its one program
    runs (the ticks): frames between 0 and 36 show it adapting, not a jump at its end."""
    samplers.run(None, TARGET, X0, key=jax.random.key(1), num_steps=40, chunk_size=10,
                 adaptation=samplers.LAPS(num_steps1=30, num_adaptation_steps=6),
                 progress=True)  # fmt: skip
    shown = frames(capsys.readouterr().err)
    counts = {int(f.split("/76")[0].split()[-1]) for f in shown if "phase=adapting..." in f}
    assert any(0 < n < 36 for n in counts), shown
    assert "76/76" in shown[-1]


def test_the_bar_keeps_its_width_beside_long_fields():
    """The fields never squeeze the bar: it is 20 characters wide in every frame, and
    the phases' times come at the end only."""
    out = io.StringIO()
    bar = Progress(100, enabled=True, file=out)
    for name in ("initialising", "adapting", "compiling"):
        with bar.phase(name):
            pass
    bar.advance(50, 0.5, 1.0, "sampling")
    bar.close()
    shown = frames(out.getvalue())
    assert all(len(f.split("|")[1]) == 20 for f in shown), shown
    timed = [i for i, f in enumerate(shown) if "initialising=" in f]
    assert timed and timed[0] >= len(shown) - 2  # the closing frame (tqdm draws it twice)


def test_progress_is_silent_under_a_trace(capsys):
    def final(key):
        return samplers.run(samplers.MALA(0.5), TARGET, X0, key=key, num_steps=10,
                            progress=True).state.position  # fmt: skip

    jax.jit(final)(jax.random.key(0))
    assert capsys.readouterr().err == ""


def test_a_resumed_run_starts_its_bar_at_the_saved_step(tmp_path, capsys):
    options = dict(key=jax.random.key(2), num_steps=40, chunk_size=10, progress=True,
                   checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    with pytest.raises(KeyboardInterrupt) as err:  # as Ctrl-C, after the save at step 20
        samplers.run(samplers.MALA(0.5), TARGET, X0, **options,
                     on_chunk=after_save(tmp_path, 20, KeyboardInterrupt))  # fmt: skip
    assert err.value.step == 20 and samplers.checkpoint.inspect(tmp_path)["step"] == 20
    assert "interrupted at step 20 of 40" in str(err.value.__notes__)
    capsys.readouterr()
    samplers.run(samplers.MALA(0.5), TARGET, X0, **options)
    shown = frames(capsys.readouterr().err)
    assert "20/40" in shown[0] and not any(" 0/40" in f for f in shown)
    assert "40/40" in shown[-1] and "initialising" not in "\n".join(shown)
