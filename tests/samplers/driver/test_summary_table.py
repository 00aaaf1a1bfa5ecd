"""`Result.summary`'s table (samplers/driver/_summary.py): NumPyro's and ArviZ's columns,
one number format per column, every row up to `SUMMARY_MAX_ROWS`, ESS not capped at the
number of draws, R-hat columns named by kind."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.driver import _summary  # private: the table formatter on its own

GAUSSIAN = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)


def run(sampler, target, positions, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        return samplers.run(sampler, target, positions, key=jax.random.key(1), progress=False,
                            **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def antithetic():
    """64 chains of HMC whose path (2.7) is near half a period of the unit-scale
    coordinate: each draw lands near the mirror image of the last, so the chain means are
    far more precise than independent draws'. Kept draws (thin=1); automatic superchains."""
    positions = jax.random.normal(jax.random.key(0), (64, 3))
    return run(samplers.HMC(0.9, 3), GAUSSIAN, positions, num_steps=200, thin=1)


def table(text):
    """`(header cells, {row name: cells})` of a summary's table."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line and set(line) == {"-"})
    header = [cell for cell in re.split(r"\s{2,}", lines[rule - 1].strip()) if cell]
    rows = {}
    for line in lines[rule + 1 :]:
        if line.startswith("("):
            break
        name, *cells = line.split()
        rows[name] = cells
    return header, rows


def test_the_columns_with_draws_are_numpyros_and_arvizs(antithetic):
    text = antithetic.summary(print_it=False)
    header, rows = table(text)
    assert header == ["mean", "sd", "median", "5%", "95%", "ESS (mean)", "ESS (bulk)",
                      "ESS (tail)", "R-hat (split)", "R-hat (nested)", "ref mean"]  # fmt: skip
    assert list(rows) == ["x[0]", "x[1]", "x[2]"] and all(len(r) == 11 for r in rows.values())
    assert "note:" not in text and "..." not in text
    trace = np.asarray(antithetic.trace, np.float64)
    cells = dict(zip(header, zip(*rows.values(), strict=True), strict=True))
    for name, q in (("median", 0.5), ("5%", 0.05), ("95%", 0.95)):
        np.testing.assert_allclose(
            [float(c) for c in cells[name]], np.quantile(trace, q, axis=(0, 1)), atol=1e-3
        )


def test_bulk_and_tail_ess_are_arvizs_on_the_same_draws(antithetic):
    az = pytest.importorskip("arviz")
    if int(az.__version__.split(".")[0]) >= 1:
        pytest.skip("ArviZ 1.x's ESS of these draws differs from 0.x's (open; ours is 0.x's)")
    _, rows = table(antithetic.summary(print_it=False))
    idata = antithetic.to_arviz()
    for column, method in ((6, "bulk"), (7, "tail")):
        expected = az.ess(idata, method=method)["x"].values
        shown = [float(cells[column]) for cells in rows.values()]
        np.testing.assert_allclose(shown, expected, rtol=1e-3, atol=1)


def test_ess_is_not_capped_at_the_number_of_draws(antithetic):
    draws = antithetic.num_chains * antithetic.num_steps  # 12,800
    ess = np.asarray(antithetic.diagnostics.ess)
    assert ess.max() > 1.5 * draws  # anti-correlated chains: more than the draws ...
    assert ess.max() <= draws * np.log10(draws)  # ... up to ArviZ's bound
    _, rows = table(antithetic.summary(print_it=False))
    assert float(rows["x[0]"][5]) == pytest.approx(float(ess[0]), abs=1)  # shown as it is
    assert max(float(r[6]) for r in rows.values()) > draws  # ArviZ's bulk ESS agrees


def test_ess_from_moments_reaches_arvizs_bound_not_the_draws():
    # Perfectly anti-correlated chains (x, -x, x, ...): their means are exact.
    signs = (-1.0) ** np.arange(10)
    draws = np.random.default_rng(0).normal(size=(100, 1, 2)) * signs[None, :, None]
    draws += 1e-3 * np.random.default_rng(1).normal(size=draws.shape)
    e = samplers.diagnostics.ess_from_moments(draws.mean(1), draws.var(1, ddof=1), 10)
    np.testing.assert_allclose(e, 1000 * np.log10(1000), rtol=1e-6)
    same = np.zeros((8, 1), np.float32)  # identical chains count every draw, as before
    assert samplers.diagnostics.ess_from_moments(same, same, 5) == 40


def test_without_draws_a_note_replaces_the_quantiles():
    result = run(samplers.MALA(0.5), GAUSSIAN, jnp.zeros((8, 3)), num_steps=20, thin=0)
    text = result.summary(print_it=False)
    header, rows = table(text)
    assert header == ["mean", "sd", "ESS (mean)", "R-hat (split)", "ref mean"]
    notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: median, 5%, 95%, ESS (bulk) and ESS (tail) need draws: pass thin=1 to samplers.run"
    ]
    # Few chains: split R-hat only, named by kind, in the table and the run's lines.
    assert "max R-hat (split) " in text and "R-hat (nested)" not in text
    assert "verdict read: split R-hat" in text


def test_rhat_columns_and_header_name_their_kind(antithetic):
    text = antithetic.summary(print_it=False)
    line = next(line for line in text.splitlines() if line.startswith("max R-hat"))
    split = np.max(np.asarray(antithetic.diagnostics.rhat))
    nested = np.max(np.asarray(antithetic.diagnostics.nested_rhat))
    assert line.startswith(f"max R-hat (split) {split:.4f}, max R-hat (nested) {nested:.4f}, ")
    assert "verdict read: nested R-hat" in text


def cell_format(cell):
    """The format of one cell: its decimals (fixed) or 'e' with its decimals."""
    if cell in ("nan", "inf", "-inf"):
        return None
    mantissa, _, exponent = cell.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return ("e" if exponent else "f", decimals)


class Scaled(samplers.targets.IllConditionedGaussian):
    """A standard normal observed at scales 1e-5, 1 and 1e5."""

    def observable(self, x):
        return x * jnp.array([1e-5, 1.0, 1e5])


def test_each_column_has_one_number_format():
    # Scales 1e-5, 1 and 1e5 in one table (and its ESS up to 1e5): one format per column.
    positions = jax.random.normal(jax.random.key(0), (64, 3))
    result = run(samplers.MALA(1.0), Scaled(3, 1.0), positions, num_steps=40, thin=1)
    header, rows = table(result.summary(print_it=False))
    for i, name in enumerate(header):
        formats = {cell_format(cells[i]) for cells in rows.values()} - {None}
        assert len(formats) == 1, (name, [cells[i] for cells in rows.values()])
    by_name = dict(zip(header, zip(*rows.values(), strict=True), strict=True))
    assert all(re.fullmatch(r"-?\d\.\d{3}e[+-]\d\d", c) for c in by_name["mean"])
    assert all(re.fullmatch(r"\d+", c) for c in by_name["ESS (mean)"])
    assert all(re.fullmatch(r"\d\.\d{4}", c) for c in by_name["R-hat (split)"])


def test_format_column():
    assert _summary.format_column(np.array([1.0, 1.28e5, 9.966e-06]), "value") == [
        "1.000e+00", "1.280e+05", "9.966e-06"]  # fmt: skip
    assert _summary.format_column(np.array([1.0, 0.5, -12.25]), "value") == [
        "1.00", "0.50", "-12.25"]  # fmt: skip
    assert _summary.format_column(np.array([1.0, 0.001]), "value") == ["1.000e+00", "1.000e-03"]
    assert _summary.format_column(np.array([0.001234, 0.0005]), "value") == [
        "0.001234", "0.000500"]  # fmt: skip
    assert _summary.format_column(np.array([0.0, 0.0]), "value") == ["0.000", "0.000"]
    assert _summary.format_column(np.array([1.00049, np.nan]), "rhat") == ["1.0005", "nan"]
    assert _summary.format_column(np.array([12.5, 130000.2]), "ess") == ["12", "130000"]


@pytest.fixture(scope="module")
def wide():
    """101 coordinates, one more than the default number of rows."""
    target = samplers.targets.IllConditionedGaussian(dim=101, condition_number=4.0)
    return run(samplers.MALA(0.5), target, jnp.zeros((8, 101)), num_steps=10)


def test_every_row_up_to_the_documented_size_then_a_note(wide):
    assert _summary.SUMMARY_MAX_ROWS == 100
    text = wide.summary(print_it=False)
    _, rows = table(text)
    assert list(rows) == [f"x[{i}]" for i in range(100)]
    assert "..." not in text
    assert text.splitlines()[-1] == (
        "(1 of 101 rows not shown: summary(max_rows=None) shows every row)"
    )
    every = wide.summary(max_rows=None, print_it=False)
    assert list(table(every)[1]) == [f"x[{i}]" for i in range(101)] and "not shown" not in every
    few = wide.summary(max_rows=5, print_it=False)
    assert list(table(few)[1]) == [f"x[{i}]" for i in range(5)]
    assert few.splitlines()[-1].startswith("(96 of 101 rows not shown")
    # As many rows as max_rows: all shown, without a note.
    assert "not shown" not in wide.summary(max_rows=101, print_it=False)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "all", True])
def test_max_rows_must_be_none_or_positive(wide, bad):
    with pytest.raises(enn.EnsembleError, match="max_rows must be"):
        wide.summary(max_rows=bad, print_it=False)
