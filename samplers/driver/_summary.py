"""`Result.summary`'s table: one row per coordinate, one number format per column.

Columns, left to right (those that cannot be computed are left out, with one note saying
why, rather than shown with wrong numbers):

* `mean`, `sd`: the ensemble's estimates, from every chain's streaming moments over all
  sampling draws.
* `median`, `5%`, `95%`: quantiles (equal-tailed, linear interpolation as `np.quantile`;
  not NumPyro's 90% HPDI) of the kept draws, `result.trace`. Streaming moments hold no
  quantiles: without a trace (`thin=None`) a note says to pass `thin=1`.
* `ESS (mean)`: the effective sample size of the mean from every chain's moments over all
  sampling draws (`samplers.diagnostics.ess_from_moments`): the ESS the verdict reads.
  Like ArviZ's ESS it is not capped at the number of draws (anti-correlated chains exceed
  it), only at ArviZ's bound `S * log10(S)` for `S` draws.
* `ESS (bulk)`, `ESS (tail)`: ArviZ's rank-normalized bulk ESS and its tail ESS (of the 5%
  and 95% quantiles), `az.ess(method="bulk" / "tail")` on the kept draws (so with
  `thin=k` they count every k-th draw), as `az.summary(result.to_arviz())` reports them.
* `R-hat (split)`: split R-hat from per-half moments; `R-hat (nested)`: nested R-hat over
  the run's superchains, when it had any. The summary's `verdict read:` line says which of
  the two the verdict reads.
* `ref mean`: the reference mean, when the run had one.

Formats: each column has one, used by every row (decimal points aligned). Values print in
fixed point with the same number of decimals, enough for 4 significant figures of the
column's largest value; the whole column switches to scientific notation with 3 decimals
(4 significant figures) when its largest value is at least 1e6 or below 1e-3, or when its
smallest nonzero value would keep fewer than 2 significant digits (1.28e5 beside 1e-5).
ESS columns print as whole numbers, R-hat with 4 decimals (as the verdict line).

Adaptation lines (notes before the table), for an adaptation whose info reports them
(`WindowAdaptation`): the target acceptance and the final buffer's (the acceptance line
above shows what the tuned step size reached while sampling), and the chains the warmup
repaired (stuck far from the ensemble, restarted at a healthy chain) or restarted
(non-finite), when there were any.

Rows: every coordinate up to `SUMMARY_MAX_ROWS` = 100 (`max_rows`); beyond that, the first
`max_rows` rows and a note saying how many were left out, and that `max_rows=None` shows
them all.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn

SUMMARY_MAX_ROWS = 100
SIGNIFICANT = 4  # significant figures of a column's largest value
_DRAWN = ("median", "5%", "95%")
_NEEDS_DRAWS = "median, 5%, 95%, ESS (bulk) and ESS (tail)"


def check_max_rows(max_rows: Any) -> None:
    if max_rows is None:
        return
    if isinstance(max_rows, bool) or not isinstance(max_rows, int | np.integer) or max_rows < 1:
        raise enn.EnsembleError(
            f"max_rows must be None (every row) or an int >= 1, got {max_rows!r}.\n  fix: "
            "summary(max_rows=None) shows every coordinate."
        )


def format_column(values: np.ndarray, kind: str) -> list[str]:
    """One column's values as strings in one format: `kind` is "value", "ess" or "rhat".

    Example:
        >>> from samplers.driver._summary import format_column
        >>> format_column(np.array([1.0, 128000.0, 9.966e-06]), "value")
        ['1.000e+00', '1.280e+05', '9.966e-06']
        >>> format_column(np.array([0.5, -12.25, 3.0]), "value")
        ['0.50', '-12.25', '3.00']
        >>> format_column(np.array([12.4, 25000.0, np.nan]), "ess")
        ['12', '25000', 'nan']
    """
    values = np.asarray(values, dtype=np.float64)
    if kind == "ess":
        return [f"{v:.0f}" for v in values]
    if kind == "rhat":
        return [f"{v:.4f}" for v in values]
    magnitudes = np.abs(values[np.isfinite(values) & (values != 0)])
    if not magnitudes.size:
        return [f"{v:.{SIGNIFICANT - 1}f}" for v in values]
    largest, smallest = float(magnitudes.max()), float(magnitudes.min())
    decimals = max(0, SIGNIFICANT - 1 - math.floor(math.log10(largest)))
    # Fixed point, unless the column's largest value is huge or tiny, or its smallest would
    # keep fewer than 2 significant digits at these decimals: then scientific, every row.
    if not 1e-3 <= largest < 1e6 or smallest < 10.0 ** (1 - decimals):
        return [f"{v:.{SIGNIFICANT - 1}e}" for v in values]
    return [f"{v:.{decimals}f}" for v in values]


def _trace_columns(trace: Any, rows: np.ndarray) -> np.ndarray | None:
    """The kept draws of the coordinates `rows` (flat indices, in the order of `names`) as
    a host array `(chains, draws, len(rows))`, or None when the draws are not all on this
    process (several processes: each holds its own chains)."""
    leaves = jax.tree.leaves(trace)
    if not all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves):
        return None
    parts, start = [], 0
    for leaf in leaves:
        chains, draws = np.shape(leaf)[:2]
        size = int(np.prod(np.shape(leaf)[2:], dtype=int))
        mine = rows[(rows >= start) & (rows < start + size)] - start
        if mine.size:
            parts.append(np.asarray(leaf).reshape(chains, draws, size)[:, :, mine])
        start += size
    return np.concatenate(parts, axis=-1)


def adaptation_lines(info: Any) -> list[str]:
    """What the adaptation's `info` reports about its warmup, in one line (none for an
    info without those fields).

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.driver._summary import adaptation_lines
        >>> class Info:
        ...     target_acceptance, acceptance = jnp.float32(0.8), jnp.float32(0.79)
        ...     num_repaired, num_restarted = jnp.int32(3), jnp.int32(0)
        >>> for part in adaptation_lines(Info())[0].split("; "):
        ...     print(part)
        warmup: target acceptance 0.800 (final buffer 0.790)
        3 chains repaired (stuck far from the ensemble, restarted at healthy chains)
    """
    parts = []
    target = getattr(info, "target_acceptance", None)
    reached = getattr(info, "acceptance", None)
    if target is not None and reached is not None:
        # The final buffer's steps swing around the tuned step size; the sampling line
        # above shows the acceptance the tuned step size reached.
        parts.append(f"target acceptance {float(target):.3f} (final buffer {float(reached):.3f})")
    repaired = int(np.asarray(getattr(info, "num_repaired", 0)))
    if repaired:
        parts.append(
            f"{repaired} chain{'s' * (repaired != 1)} repaired (stuck far from the ensemble, "
            "restarted at healthy chains)"
        )
    restarted = int(np.asarray(getattr(info, "num_restarted", 0)))
    if restarted:
        parts.append(f"{restarted} restarted (non-finite)")
    return ["warmup: " + "; ".join(parts)] if parts else []


def table(
    result: Any, flat: Any, max_rows: int | None, hints: str = "library"
) -> tuple[list[str], list[str]]:
    """`(notes, lines of the table)` of `result`'s diagnostics; `flat` maps a diagnostics
    field to one host vector in the order of `result.names`; `hints` "cli" words the notes
    for the command line (which keeps no draws)."""
    from .. import diagnostics as diag

    d = result.diagnostics
    names = result.names
    dim = len(names)
    shown = dim if max_rows is None else min(dim, max_rows)
    rows = np.arange(shown)
    columns: dict[str, tuple[np.ndarray, str]] = {
        "mean": (flat(d.mean)[rows], "value"),
        "sd": (flat(d.sd)[rows], "value"),
    }
    notes = adaptation_lines(getattr(result, "adaptation_info", None))
    draws = None if result.trace is None else _trace_columns(result.trace, rows)
    if result.trace is None:
        keep = "pass thin=1 to samplers.run" if hints != "cli" else (
            "the command line keeps none (samplers.run(..., thin=1) does)"
        )  # fmt: skip
        notes.append(f"note: {_NEEDS_DRAWS} need draws: {keep}")
    elif draws is None:
        notes.append(f"note: {_NEEDS_DRAWS} need the draws on one process (see to_arviz)")
    else:
        quantiles = np.quantile(draws.astype(np.float64), [0.5, 0.05, 0.95], axis=(0, 1))
        for name, values in zip(_DRAWN, quantiles, strict=True):
            columns[name] = (values, "value")
    columns["ESS (mean)"] = (flat(d.ess)[rows], "ess")
    if draws is not None:
        if draws.shape[1] >= 4:
            kept = jnp.asarray(draws)
            columns["ESS (bulk)"] = (np.asarray(diag.ess(kept, "bulk")), "ess")
            columns["ESS (tail)"] = (np.asarray(diag.ess(kept, "tail")), "ess")
        else:
            notes.append(
                f"note: ESS (bulk) and ESS (tail) need at least 4 kept draws per chain (this "
                f"run kept {draws.shape[1]}): a smaller thin="
            )
    columns["R-hat (split)"] = (flat(d.rhat)[rows], "rhat")
    if d.nested_rhat is not None:
        columns["R-hat (nested)"] = (flat(d.nested_rhat)[rows], "rhat")
    reference_mean = getattr(result.reference, "mean", None)
    if reference_mean is not None and np.size(reference_mean) == dim:
        columns["ref mean"] = (np.ravel(np.asarray(reference_mean))[rows], "value")

    cells = {name: format_column(values, kind) for name, (values, kind) in columns.items()}
    widths = {name: max(len(name), *map(len, text)) for name, text in cells.items()}
    first = max([6] + [len(names[r]) for r in rows])
    header = f"{'':<{first}}" + "".join(f"  {name:>{widths[name]}}" for name in cells)
    lines = [header, "-" * len(header)]
    for i, r in enumerate(rows):
        lines.append(
            f"{names[r]:<{first}}"
            + "".join(f"  {text[i]:>{widths[name]}}" for name, text in cells.items())
        )
    if shown < dim:
        lines.append(
            f"({dim - shown} of {dim} rows not shown: summary(max_rows=None) shows every row)"
        )
    return notes, lines
