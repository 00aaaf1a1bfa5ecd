"""Build hook: run the documentation's code before mkdocs collects the files.

Every Markdown page under `docs/` whose fenced ```` ```python ```` blocks are meant to run is
executed as ONE script (its blocks top to bottom, in one namespace), in a fresh Python
process, with the working directory set to `docs/generated/`. The pictures the code saves
with relative file names (`plt.savefig("quickstart-banana.png")`) therefore land in
`docs/generated/`, which is git-ignored and which the pages link to as
`../generated/NAME.png`. Nothing generated is committed: a clean clone builds them.

Conventions, shared with `tests/test_docs.py`:

* A ```` ```python ```` (or ```` ```py ````) block runs. Other languages (`bash`, `text`)
  never run.
* A block preceded by the line `<!-- no-run -->` (blank lines in between are allowed) is
  shown but not run: keep it for code that cannot run in a docs build (a multi-process
  launcher). An HTML comment is invisible on the rendered page.
* Line numbers are kept: the script has the page's text outside code blocks blanked out, so
  a traceback points at the Markdown line (`File "docs/tutorials/x.md", line 42`).
* Pages set `XLA_FLAGS` themselves (their first block, before importing jax) to get 4
  simulated CPU devices; the runner forces `JAX_PLATFORMS=cpu` and `MPLBACKEND=Agg`.

Execution is cached: a page reruns only when its code, the library's source or this file
changed, or an image it links to is missing. `ENSEMBLENN_DOCS_EXECUTE=always` forces every
page to run, `never` skips running (a strict build then fails on missing images).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
GENERATED = DOCS / "generated"
STAMPS = GENERATED / ".stamps"  # dot-folder: mkdocs does not publish it
NO_RUN = "<!-- no-run -->"
PAGE_TIMEOUT_S = 900
LIBRARY_PACKAGES = ("ensemblenn", "samplers")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_IMAGE = re.compile(r"\(\s*(?:\.\./)*generated/(?P<name>[^)\s]+)\s*\)")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its language, first code line (1-based), code."""

    language: str
    line: int
    code: str
    run: bool


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, in order.

    `run` is True for a python block not preceded by the `<!-- no-run -->` marker.
    """
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    last_text = ""  # the last non-blank line outside a block
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            if lines[i].strip():
                last_text = lines[i].strip()
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        info = match["info"].strip()
        language = re.split(r"[\s{]", info, maxsplit=1)[0].lstrip(".").lower() if info else ""
        start = i + 1
        j = start
        closing = re.compile(rf"^ {{0,{indent + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        code = "\n".join(
            line[indent:] if line[:indent].strip() == "" else line for line in lines[start:j]
        )
        runs = language in ("python", "py") and last_text != NO_RUN
        found.append(Block(language, start + 1, code, runs))
        last_text = ""
        i = j + 1
    return found


def script(text: str) -> str:
    """The page's runnable code as one script whose line numbers are the page's."""
    lines = [""] * len(text.splitlines())
    for block in blocks(text):
        if not block.run:
            continue
        for k, line in enumerate(block.code.splitlines()):
            lines[block.line - 1 + k] = line
    return "\n".join(lines) + "\n"


def code(text: str) -> str:
    """The runnable code of a page, blocks joined (what the build cache is keyed on)."""
    return "\n\n".join(b.code for b in blocks(text) if b.run)


def images(text: str) -> list[str]:
    """File names under `generated/` that the page links to."""
    return sorted({m["name"] for m in _IMAGE.finditer(text)})


def executable_pages(docs: Path = DOCS) -> list[Path]:
    """Every page with at least one block that runs, in a stable order."""
    pages = []
    for path in sorted(docs.rglob("*.md")):
        if GENERATED in path.parents:
            continue
        if any(b.run for b in blocks(path.read_text(encoding="utf-8"))):
            pages.append(path)
    return pages


def page_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a page runs in: CPU JAX, a file-only matplotlib backend, the
    repository importable."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.pop("XLA_FLAGS", None)  # the page sets the device count itself
    if extra:
        env.update(extra)
    return env


_RUNNER = (
    "import sys\n"
    "path = sys.argv[1]\n"
    "source = sys.stdin.read()\n"
    "exec(compile(source, path, 'exec'), {'__name__': '__main__', '__file__': path})\n"
)


@dataclass
class Outcome:
    page: Path
    returncode: int
    output: str
    seconds: float


def run_page(
    page: Path,
    *,
    cwd: Path = GENERATED,
    timeout: float = PAGE_TIMEOUT_S,
    env: dict[str, str] | None = None,
    epilogue: str = "",
) -> Outcome:
    """Run one page's script (then `epilogue`, if any) in a fresh interpreter; never raises
    on a failing page."""
    cwd.mkdir(parents=True, exist_ok=True)
    source = script(page.read_text(encoding="utf-8")) + epilogue
    shown = os.path.relpath(page, ROOT)
    tick = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, shown],
            input=source,
            text=True,
            capture_output=True,
            cwd=cwd,
            env=env or page_environment(),
            timeout=timeout,
        )
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"") + (err.stderr or b"")
        output = out.decode(errors="replace") if isinstance(out, bytes) else out
        code, output = -1, output + f"\n[timed out after {timeout:.0f} s]"
    return Outcome(page, code, output, time.perf_counter() - tick)


def run_pages(
    pages: list[Path],
    *,
    cwd: Path = GENERATED,
    workers: int | None = None,
    timeout: float = PAGE_TIMEOUT_S,
    env: dict[str, str] | None = None,
    epilogue: str = "",
) -> list[Outcome]:
    """Run pages concurrently (each in its own process); outcomes in the pages' order."""
    workers = workers or max(1, min(len(pages), os.cpu_count() or 1, 4))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(
            pool.map(
                lambda p: run_page(p, cwd=cwd, timeout=timeout, env=env, epilogue=epilogue), pages
            )
        )


def _library_digest() -> str:
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    for package in LIBRARY_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _stamp(page: Path) -> Path:
    return STAMPS / (str(page.relative_to(DOCS)).replace(os.sep, "__") + ".json")


def _up_to_date(page: Path, digest: str) -> bool:
    stamp = _stamp(page)
    if not stamp.is_file():
        return False
    try:
        saved = json.loads(stamp.read_text())
    except ValueError:
        return False
    text = page.read_text(encoding="utf-8")
    fresh = saved.get("digest") == digest and saved.get("code") == _sha(code(text))
    return fresh and all((GENERATED / name).is_file() for name in images(text))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class DocsExecutionError(RuntimeError):
    """A documentation page's code failed, or did not write an image its page shows."""


def check(outcome: Outcome, *, digest: str | None = None) -> str | None:
    """What is wrong with a page's run (None if nothing); records a successful run so that
    the next build can skip the page while nothing it depends on changes."""
    page, name = outcome.page, str(outcome.page.relative_to(DOCS))
    text = page.read_text(encoding="utf-8")
    if outcome.returncode != 0:
        return (
            f"{name} failed (exit {outcome.returncode}) after {outcome.seconds:.0f} s:\n"
            f"{outcome.output[-4000:]}"
        )
    missing = [i for i in images(text) if not (GENERATED / i).is_file()]
    if missing:
        return f"{name} ran but did not write {missing} into {GENERATED}"
    STAMPS.mkdir(parents=True, exist_ok=True)
    _stamp(page).write_text(
        json.dumps({"digest": digest or _library_digest(), "code": _sha(code(text))})
    )
    return None


def generate(pages: list[Path] | None = None, *, force: bool = False, log=print) -> None:
    """Run every page that needs it and check the images its page links to exist.

    Raises:
        DocsExecutionError: a page failed (its output's tail is in the message) or did not
            produce an image it links to.
    """
    GENERATED.mkdir(parents=True, exist_ok=True)
    pages = executable_pages() if pages is None else pages
    digest = _library_digest()
    stale = [p for p in pages if force or not _up_to_date(p, digest)]
    if not stale:
        log(f"docs: {len(pages)} executable pages up to date")
        return
    log(
        f"docs: running {len(stale)} page(s): " + ", ".join(str(p.relative_to(DOCS)) for p in stale)
    )
    problems = []
    for outcome in run_pages(stale):
        problem = check(outcome, digest=digest)
        if problem:
            problems.append(problem)
        else:
            log(f"docs: {outcome.page.relative_to(DOCS)} ran in {outcome.seconds:.0f} s")
    if problems:
        raise DocsExecutionError("\n\n".join(problems))


# --- mkdocs hooks ------------------------------------------------------------------------------


def on_pre_build(config, **kwargs) -> None:  # noqa: ARG001 - mkdocs hook signature
    """Run the pages' code (cached) before mkdocs collects `docs/`, images included."""
    mode = os.environ.get("ENSEMBLENN_DOCS_EXECUTE", "auto").lower()
    if mode not in ("auto", "always", "never"):
        raise DocsExecutionError(
            f"ENSEMBLENN_DOCS_EXECUTE must be auto, always or never, got {mode!r}."
        )
    GENERATED.mkdir(parents=True, exist_ok=True)
    if mode == "never":
        return
    import logging

    logger = logging.getLogger("mkdocs.hooks.ensemblenn")
    generate(force=mode == "always", log=logger.info)
