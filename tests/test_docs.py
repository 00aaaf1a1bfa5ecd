"""The documentation site: its code runs, every public name is documented, it builds strictly.

* Every page under `docs/` with runnable ```` ```python ```` blocks is executed as one script
  (blocks top to bottom, one namespace) in a fresh process, because the page must set the
  device count before it imports jax; the pages set 4 simulated devices themselves and this
  test checks they did. The runs go through `docs/hooks.py`, the same code the mkdocs build
  hook uses, and write their pictures into `docs/generated/` (git-ignored), so a build in the
  same session reuses them.
* Every public name of `ensemblenn` and `samplers` (its submodules included) has a docstring
  with an example and appears in an API page (`::: name` in `docs/api/*.md`).
* `mkdocs build --strict` succeeds and the HTML shows the generated pictures (slow).
"""

import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"
NUM_DEVICES = 4


def _load_hooks() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_ensemblenn_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()
PAGES = hooks.executable_pages()
PAGE_IDS = [str(p.relative_to(DOCS)) for p in PAGES]

# Public names whose docstring has no example yet: each is reported as an expected failure
# (xfail) until its owner adds one, then must be removed from here. Empty: every public name
# has an example. `test_pending_examples_are_public_names` keeps the list honest.
EXAMPLES_PENDING: frozenset[str] = frozenset()


# --- the block parser shared with the build hook -------------------------------------------


def test_blocks_and_markers():
    text = "\n".join(
        [
            "# Title",  # 1
            "```python",  # 2
            "x = 1",  # 3
            "```",  # 4
            "<!-- no-run -->",  # 5
            "",  # 6
            "```python",  # 7
            "raise SystemExit('launcher')",  # 8
            "```",  # 9
            "```bash",  # 10
            "echo not python",  # 11
            "```",  # 12
            "```py",  # 13
            "y = x + 1",  # 14
            "```",  # 15
            "![a plot](../generated/a.png) and ![b](generated/b.png)",
        ]
    )
    found = hooks.blocks(text)
    assert [(b.language, b.line, b.run) for b in found] == [
        ("python", 3, True),
        ("python", 8, False),
        ("bash", 11, False),
        ("py", 14, True),
    ]
    lines = hooks.script(text).splitlines()
    assert lines[2] == "x = 1" and lines[13] == "y = x + 1"  # page line numbers are kept
    assert "SystemExit" not in hooks.script(text) and "echo" not in hooks.script(text)
    assert hooks.images(text) == ["a.png", "b.png"]


def test_every_tutorial_is_executed():
    expected = {
        "getting-started/quickstart.md",
        "tutorials/partition-roles.md",
        "tutorials/subclassing.md",
        "tutorials/optax.md",
        "tutorials/scaling-out.md",
        "tutorials/diagnostics.md",
    }
    assert expected <= set(PAGE_IDS)
    # Blocks that never run are the exception: one launcher in the scaling-out tutorial.
    skipped = sum(
        1
        for page in DOCS.rglob("*.md")
        for b in hooks.blocks(page.read_text())
        if b.language == "python" and not b.run
    )
    assert skipped <= 2


# --- every page's code runs, on 4 simulated devices ----------------------------------------

# Appended to each page's script: the page itself must have asked for the devices.
_EPILOGUE = (
    "\nimport jax as _jax\n"
    f"assert _jax.device_count() == {NUM_DEVICES}, "
    "f'the page ran on {_jax.devices()}: set XLA_FLAGS in its first block'\n"
)


@pytest.fixture(scope="module")
def page_runs():
    """Run every executable page once (two at a time), each in a fresh interpreter."""
    for module in ("matplotlib", "arviz"):  # the pages draw pictures and export to ArviZ
        pytest.importorskip(module)
    env = hooks.page_environment()  # no XLA_FLAGS: the page sets the device count
    outcomes = hooks.run_pages(PAGES, workers=2, timeout=600, env=env, epilogue=_EPILOGUE)
    return dict(zip(PAGE_IDS, outcomes))


@pytest.mark.parametrize("page", PAGE_IDS)
def test_page_runs(page_runs, page):
    outcome = page_runs[page]
    assert outcome.returncode == 0, (
        f"{page} failed after {outcome.seconds:.0f} s:\n{outcome.output[-6000:]}"
    )
    problem = hooks.check(outcome)  # also records the run for the build's cache
    assert problem is None, problem


def test_pictures_are_generated_not_committed():
    linked = {name for page in PAGES for name in hooks.images(page.read_text())}
    assert {
        "quickstart-posterior.png",
        "diagnostics-trace.png",
        "diagnostics-bias.png",
        "diagnostics-banana-corner.png",
    } <= linked
    gitignore = (ROOT / ".gitignore").read_text().split()
    assert "/docs/generated/" in gitignore


# --- every public name: an example in its docstring, a place in the API pages --------------


def _public_names() -> dict[str, object]:
    import ensemblenn as enn
    import samplers

    names: dict[str, object] = {f"ensemblenn.{n}": getattr(enn, n) for n in enn.__all__}
    modules: dict[str, types.ModuleType] = {}
    exported = getattr(samplers, "__all__", None) or [
        n for n in vars(samplers) if not n.startswith("_")
    ]
    for name in exported:
        value = getattr(samplers, name)
        if isinstance(value, types.ModuleType):
            modules[name] = value
        else:
            names[f"samplers.{name}"] = value
    modules.setdefault("ensembles", importlib.import_module("samplers.ensembles"))
    for name, module in modules.items():
        exported = getattr(module, "__all__", None)
        if exported is None:  # its own public definitions (or its private submodules')
            exported = [
                k
                for k, v in vars(module).items()
                if not k.startswith("_")
                and not isinstance(v, types.ModuleType)
                and str(getattr(v, "__module__", "") or "").startswith(module.__name__)
            ]
        for attribute in exported:
            names[f"samplers.{name}.{attribute}"] = getattr(module, attribute)
    return names


PUBLIC = _public_names()


def _resolve(path: str) -> object:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(path)


def _documented() -> tuple[set[str], list[object], list[str]]:
    """The `::: path` directives of the API pages, the objects they name, and those that
    name nothing (a renamed or removed object)."""
    paths, objects, unresolved = set(), [], []
    for page in sorted(API.glob("*.md")):
        paths |= set(re.findall(r"^:::\s*([\w.]+)", page.read_text(), re.MULTILINE))
    for path in sorted(paths):
        try:
            objects.append(_resolve(path))
        except (ImportError, AttributeError):
            unresolved.append(path)
    return paths, objects, unresolved


DOCUMENTED_PATHS, DOCUMENTED_OBJECTS, UNRESOLVED = _documented()


def _own_docstring(obj: object) -> str | None:
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__")
    return getattr(obj, "__doc__", None)


def _ours(obj: object) -> bool:
    """A class or function defined in this library (not a re-exported alias of another
    library's object, such as `samplers.Hyper = typing.Any`)."""
    module = str(getattr(obj, "__module__", "") or "")
    return (inspect.isclass(obj) or callable(obj)) and module.split(".")[0] in (
        "ensemblenn",
        "samplers",
    )


def test_api_directives_resolve():
    assert not UNRESOLVED, f"API pages document names that do not exist: {UNRESOLVED}"


def test_public_names_found():
    assert {
        "ensemblenn.ensemble_map",
        "samplers.run",
        "samplers.LAPS",
        "samplers.diagnostics.nested_rhat",
        "samplers.targets.Banana",
        "samplers.ensembles.fit",
        "samplers.checkpoint.inspect",
    } <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_name_in_api_pages(name):
    obj = PUBLIC[name]
    assert name in DOCUMENTED_PATHS or any(obj is d for d in DOCUMENTED_OBJECTS), (
        f"{name} is public but no API page in docs/api/ has '::: {name}'"
    )


def _canonical_names() -> list[str]:
    """One name per documented object of ours (the shortest: `samplers.HMC`, not
    `samplers.kernels.HMC`)."""
    best: dict[int, str] = {}
    for name, obj in PUBLIC.items():
        if _ours(obj):
            key = id(obj)
            if key not in best or (len(name), name) < (len(best[key]), best[key]):
                best[key] = name
    return sorted(best.values())


CANONICAL = _canonical_names()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason="docstring example pending", strict=False))
        if n in EXAMPLES_PENDING
        else n
        for n in CANONICAL
    ],
)
def test_public_name_has_example(name):
    doc = _own_docstring(PUBLIC[name]) or ""
    assert ">>>" in doc or "```" in doc, f"{name}'s docstring has no example (>>> or ```)"


def test_pending_examples_are_public_names():
    assert EXAMPLES_PENDING <= set(CANONICAL)


# --- the site builds strictly, with the pictures ----------------------------------------------


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path, page_runs):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    pytest.importorskip("matplotlib")
    # page_runs ran (and recorded) every page, so the hook finds them up to date; a page that
    # failed there is run again by the hook and fails the build.
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for page in PAGES:
        relative = page.relative_to(DOCS).with_suffix("")
        html_path = site / ("index.html" if relative.name == "index" else relative / "index.html")
        html = html_path.read_text()
        for name in hooks.images(page.read_text()):
            assert (site / "generated" / name).is_file(), name
            assert re.search(rf'<img [^>]*src="[./]*generated/{re.escape(name)}"', html), (
                f"{html_path} does not show {name}"
            )
