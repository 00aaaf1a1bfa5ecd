"""The run's end: the last chunk is not waited for before the result is assembled.

`samplers.run` keeps one chunk in flight while it loops; after the last one it dispatches
`finalise` (the diagnostics and the trace's unravelling, all device work) and only then
waits, so the host's part of the end of a call overlaps the device's last steps. A Ctrl-C
during that wait still says how far the run got.
"""

import jax
import pytest

import samplers
from samplers.driver import _run  # private: the seam between the loop and finalise

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
X0 = jax.random.normal(jax.random.key(0), (8, 3))
# Four chunks of ten steps; no bar, checkpoint or on_chunk, each of which waits for its own.
OPTIONS = dict(key=jax.random.key(1), num_steps=40, chunk_size=10, progress=False)


def spied(monkeypatch, interrupt_after_finalise=False) -> list[str]:
    events: list[str] = []
    wait, finalise = jax.block_until_ready, _run.finalise

    def spy_wait(x):
        events.append("wait")
        if interrupt_after_finalise and "finalise" in events:
            raise KeyboardInterrupt
        return wait(x)

    def spy_finalise(*args, **kwargs):
        events.append("finalise")
        return finalise(*args, **kwargs)

    monkeypatch.setattr(jax, "block_until_ready", spy_wait)
    monkeypatch.setattr(_run, "finalise", spy_finalise)
    return events


@pytest.mark.filterwarnings("ignore::samplers.ConvergenceWarning")
def test_finalise_is_dispatched_before_the_last_chunk_is_waited_for(monkeypatch):
    events = spied(monkeypatch)
    result = samplers.run(samplers.MALA(0.5), TARGET, X0, **OPTIONS)
    # One wait per chunk before the last (the one in flight), then finalise, then the wait
    # for the last chunk.
    assert events == ["wait"] * 3 + ["finalise", "wait"], events
    assert result.trace.shape == (8, 40, 3)  # every chunk's draws, the last one's too
    assert (result.trace[:, -1] == result.state.position).all()


def test_ctrl_c_during_the_last_wait_says_how_far_the_run_got(monkeypatch):
    spied(monkeypatch, interrupt_after_finalise=True)
    with pytest.raises(KeyboardInterrupt) as err:
        samplers.run(samplers.MALA(0.5), TARGET, X0, **OPTIONS)
    # The chunks known to have run: all but the last, which was still in flight.
    assert err.value.step == 30
    assert "interrupted at step 30 of 40" in str(err.value.__notes__)
