"""The documentation site: its code runs, every public name is documented, it builds strictly.

* The pages' code is executed by markdown-exec during the build: every ```` ```python
  exec="on" ```` block, in one `session` per page, its output rendered under it. This file
  extracts the same blocks (markdown-exec's own rule: the `exec` option) and runs each page
  as one script (blocks top to bottom, one namespace, as its session is) in a fresh process,
  because the page must set the device count before it imports jax; the pages set 4
  simulated devices themselves and this test checks they did. No run of a page may warn
  NOT CONVERGED (`samplers.ConvergenceWarning`) unless the page silences the warning
  itself, where the reader sees it: an example that fails on purpose, and says so.
* Every public name of `ensemblenn` and `samplers` (its submodules included) has a docstring
  with an example and appears in an API page (`::: name` in `docs/api/*.md`).
* `mkdocs build --strict` succeeds (slow; or `ENSEMBLENN_DOCS_SITE=site` checks a built
  site: `pytest tests/test_docs.py -k test_site_`); the built site shows every page's printed output
  and pictures, references no external script, stylesheet or font host, and its internal
  links and anchors all resolve.
"""

import concurrent.futures
import html.parser
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"
NUM_DEVICES = 4

# Public names whose docstring has no example yet: each is reported as an expected failure
# (xfail) until its owner adds one, then must be removed from here. Empty: every public name
# has an example. `test_pending_examples_are_public_names` keeps the list honest.
EXAMPLES_PENDING: frozenset[str] = frozenset()


# --- the pages' blocks, as markdown-exec sees them -----------------------------------------

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_OPTION = re.compile(r'(?P<key>[\w-]+)="(?P<value>[^"]*)"')
_TRUE = ("1", "true", "yes", "on")  # markdown-exec's truthy values for `exec`


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: language, first code line (1-based), code, options."""

    language: str
    line: int
    code: str
    options: dict

    @property
    def run(self) -> bool:
        return self.language in ("python", "py") and self.options.get("exec", "") in _TRUE


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, in order."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        info = match["info"].strip()
        language = re.split(r"[\s{]", info, maxsplit=1)[0].lstrip(".").lower() if info else ""
        options = {m["key"]: m["value"].lower() for m in _OPTION.finditer(info)}
        start = j = i + 1
        closing = re.compile(rf"^ {{0,{indent + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        code = "\n".join(
            line[indent:] if line[:indent].strip() == "" else line for line in lines[start:j]
        )
        found.append(Block(language, start + 1, code, options))
        i = j + 1
    return found


def script(text: str) -> str:
    """The page's executed code as one script whose line numbers are the page's."""
    lines = [""] * len(text.splitlines())
    for block in blocks(text):
        if block.run:
            for k, line in enumerate(block.code.splitlines()):
                lines[block.line - 1 + k] = line
    return "\n".join(lines) + "\n"


def _executable_pages() -> list[Path]:
    return [
        p
        for p in sorted(DOCS.rglob("*.md"))
        if any(b.run for b in blocks(p.read_text(encoding="utf-8")))
    ]


PAGES = _executable_pages()
PAGE_IDS = [str(p.relative_to(DOCS)) for p in PAGES]


def test_blocks_and_options():
    text = "\n".join(
        [
            "# Title",  # 1
            '```python exec="on" source="above" session="t"',  # 2
            "x = 1",  # 3
            "```",  # 4
            "```python",  # 5: shown, never run (a launcher)
            "raise SystemExit('launcher')",  # 6
            "```",  # 7
            "```bash",  # 8
            "echo not python",  # 9
            "```",  # 10
            '```py exec="1" session="t"',  # 11
            "y = x + 1",  # 12
            "```",  # 13
        ]
    )
    found = blocks(text)
    assert [(b.language, b.line, b.run) for b in found] == [
        ("python", 3, True),
        ("python", 6, False),
        ("bash", 9, False),
        ("py", 12, True),
    ]
    lines = script(text).splitlines()
    assert lines[2] == "x = 1" and lines[11] == "y = x + 1"  # page line numbers are kept
    assert "SystemExit" not in script(text) and "echo" not in script(text)


def test_every_tutorial_is_executed():
    expected = {
        "index.md",
        "getting-started/quickstart.md",
        "tutorials/partition-roles.md",
        "tutorials/subclassing.md",
        "tutorials/optax.md",
        "tutorials/scaling-out.md",
        "tutorials/diagnostics.md",
        "tutorials/reading-a-run.md",
        "tutorials/warmup-and-nuts.md",
        "tutorials/pytree-models.md",
        "tutorials/numpyro-models.md",
    }
    assert expected <= set(PAGE_IDS)
    tutorials = [p for p in PAGE_IDS if p.startswith("tutorials/")]
    assert len(tutorials) >= 8, tutorials  # the Tutorials section: at least 8, each executed
    # Blocks that never run are the exception: one launcher in the scaling-out tutorial.
    skipped = sum(
        1
        for page in DOCS.rglob("*.md")
        for b in blocks(page.read_text())
        if b.language in ("python", "py") and not b.run
    )
    assert skipped <= 2


def test_one_session_per_page():
    """The build runs a page's blocks in its session, this file as one script: the same
    namespace only if every executed block of the page names the page's own session."""
    seen: dict[str, str] = {}
    for page, name in zip(PAGES, PAGE_IDS):
        sessions = {b.options.get("session") for b in blocks(page.read_text()) if b.run}
        assert len(sessions) == 1 and None not in sessions, f"{name}: sessions {sessions}"
        (session,) = sessions
        assert session not in seen, f"{name} and {seen[session]} share session {session!r}"
        seen[session] = name


def test_printed_outputs_are_shown():
    """A block that prints renders its output as text (markdown-exec's default would read it
    as Markdown), and shows its source above it unless it only draws a picture."""
    for page, name in zip(PAGES, PAGE_IDS):
        for b in blocks(page.read_text()):
            if not b.run:
                continue
            if b.options.get("html") in _TRUE:
                assert "data:image/png;base64" in b.code, f"{name}:{b.line}: html block"
                continue
            assert b.options.get("source") == "above", f"{name}:{b.line}: source not shown"
            assert b.options.get("result") == "text", f"{name}:{b.line}: output not as text"


# --- docs/hooks.py: library prints on the page, math as MathML -----------------------------


def _load_hooks() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_ensemblenn_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hook_puts_library_prints_on_the_page():
    """markdown-exec captures a block's own `print`; the hook adds what a library prints
    (`result.summary()`) to the same output."""
    markdown_exec = pytest.importorskip("markdown_exec")
    import markdown

    _load_hooks()._capture_stdout()
    fence = {"name": "python", "class": "python"}
    fence.update(validator=markdown_exec.validator, format=markdown_exec.formatter)
    md = markdown.Markdown(
        extensions=["pymdownx.superfences"],
        extension_configs={"pymdownx.superfences": {"custom_fences": [fence]}},
    )
    page = md.convert(
        '```python exec="on" source="above" result="text"\n'
        "import sys\n"
        "print('from the block')\n"
        "sys.stdout.write('from a library\\n')\n"
        "```\n"
    )
    assert "from the block" in page and "from a library" in page


def test_hook_drops_the_output_box_of_a_block_that_prints_nothing():
    markdown_exec = pytest.importorskip("markdown_exec")
    import markdown

    fence = {"name": "python", "class": "python"}
    fence.update(validator=markdown_exec.validator, format=markdown_exec.formatter)
    md = markdown.Markdown(
        extensions=["pymdownx.superfences", "pymdownx.highlight"],
        extension_configs={"pymdownx.superfences": {"custom_fences": [fence]}},
    )
    block = '```python exec="on" source="above" result="text" session="quiet"\n{}\n```\n\n'
    page = md.convert(block.format("x = 1") + block.format("print(x + 1)"))
    assert page.count("<pre>") == 4  # two sources, two outputs (one of them empty)
    page = _load_hooks().on_page_content(page)
    assert page.count("<pre>") == 3 and "2\n</code>" in page


def test_hook_renders_math_as_mathml():
    pytest.importorskip("latex2mathml")
    hooks = _load_hooks()
    page = hooks.on_page_content(
        '<p>Inline <span class="arithmatex">\\(\\hat R &lt; 1.01\\)</span> and</p>\n'
        '<div class="arithmatex">\\[\nb_i^2 = \\frac{1}{\\text{ESS}}\n\\]</div>'
    )
    assert "arithmatex" not in page and "\\(" not in page
    assert page.count("<math") == 2 and 'display="block"' in page
    assert "<mfrac>" in page
    assert re.search(r"<mo>(&lt;|&#x0003C;)</mo>", page)  # the TeX's `<`, unescaped first


# --- every page's code runs, on 4 simulated devices ----------------------------------------

# Appended to each page's script: the page itself must have asked for the devices.
_EPILOGUE = (
    "\nimport jax as _jax\n"
    f"assert _jax.device_count() == {NUM_DEVICES}, "
    "f'the page ran on {_jax.devices()}: set XLA_FLAGS in its first block'\n"
)
# A `samplers.ConvergenceWarning` the page does not silence itself (`warnings.catch_warnings`
# around the run) is shown every time, with a marker line on stderr that
# `test_page_converges` looks for: every example converges unless it fails on purpose and
# says so. The class is recognised by name, since importing samplers here would import jax
# before the page sets its devices.
CONVERGENCE_MARKER = "DOCS-CONVERGENCE-WARNING"
_RUNNER = (
    "import sys, warnings\n"
    f"_MARK = {CONVERGENCE_MARKER!r}\n"
    "_show = warnings.showwarning\n"
    "def _marked(message, category, filename, lineno, file=None, line=None):\n"
    "    if category.__name__ == 'ConvergenceWarning' and category.__module__ == 'samplers':\n"
    "        print(_MARK, f'{filename}:{lineno}: {message}', file=sys.stderr)\n"
    "    _show(message, category, filename, lineno, file, line)\n"
    "warnings.showwarning = _marked\n"
    "warnings.filterwarnings('always', message='NOT CONVERGED')\n"
    "path = sys.argv[1]\n"
    "source = sys.stdin.read()\n"
    "exec(compile(source, path, 'exec'), {'__name__': '__main__', '__file__': path})\n"
)


def _page_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the page sets it
    env.update(JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
    # The cache docs/hooks.py gives the docs build (not the suite's own, which conftest.py
    # sets): a build after the tests (CI) then loads the pages' programs instead of
    # compiling them again.
    env["JAX_COMPILATION_CACHE_DIR"] = str(ROOT / "build" / "docs-jax-cache")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _run_page(page: Path, cwd: Path) -> subprocess.CompletedProcess:
    source = script(page.read_text(encoding="utf-8")) + _EPILOGUE
    try:
        return subprocess.run(
            [sys.executable, "-c", _RUNNER, str(page.relative_to(ROOT))],
            input=source,
            text=True,
            capture_output=True,
            cwd=cwd,
            env=_page_environment(),
            timeout=600,
        )
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(err.cmd, -1, "", f"timed out after {err.timeout} s")


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    """Run every executable page once (two at a time), each in a fresh interpreter."""
    if os.environ.get("ENSEMBLENN_DOCS_PAGES") == "mkdocs":
        # CI's lane 1 builds the site strictly right after the suite, and markdown-exec runs
        # the same blocks there (an exception is a warning, so the build fails): no need to
        # run them twice. Lane 2 has no build and runs them here.
        pytest.skip("ENSEMBLENN_DOCS_PAGES=mkdocs: the strict mkdocs build runs the pages")
    for module in ("matplotlib", "arviz"):  # the pages draw pictures and export to ArviZ
        pytest.importorskip(module)
    cwd = tmp_path_factory.mktemp("pages")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(PAGE_IDS, pool.map(lambda p: _run_page(p, cwd), PAGES)))


@pytest.mark.parametrize("page", PAGE_IDS)
def test_page_runs(page_runs, page):
    proc = page_runs[page]
    assert proc.returncode == 0, f"{page} failed:\n{(proc.stdout + proc.stderr)[-6000:]}"


@pytest.mark.parametrize("page", PAGE_IDS)
def test_page_converges(page_runs, page):
    """No run of the page warns NOT CONVERGED unless the page silences the warning where the
    reader sees it (a run that fails on purpose, and whose prose says so)."""
    warned = [
        line for line in page_runs[page].stderr.splitlines() if line.startswith(CONVERGENCE_MARKER)
    ]
    assert not warned, f"{page}: examples that do not converge:\n" + "\n".join(warned)


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
        "ensemblenn.fit",
        "samplers.ensembles.sample_posterior",
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


# --- the site builds strictly; outputs, offline rendering and links ----------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strictly into a temporary folder (every page's code runs), or the one
    already built in the folder `ENSEMBLENN_DOCS_SITE` names (CI checks its own build)."""
    built = os.environ.get("ENSEMBLENN_DOCS_SITE")
    if built:
        site = Path(built).resolve()
        assert (site / "index.html").is_file(), f"ENSEMBLENN_DOCS_SITE={built}: no site there"
        return site
    for module in ("mkdocs", "mkdocstrings_handlers.python", "material", "markdown_exec"):
        pytest.importorskip(module)
    pytest.importorskip("latex2mathml")
    site = tmp_path_factory.mktemp("site")
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
    return site


def _html_of(site: Path, page: str) -> str:
    relative = Path(page).with_suffix("")
    path = site / ("index.html" if relative.name == "index" else relative / "index.html")
    return path.read_text(encoding="utf-8")


class _Refs(html.parser.HTMLParser):
    """The ids of a page, and its references: (tag, attribute, value)."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src", "srcset", "data", "poster"):
            if attrs.get(key):
                self.refs.append((tag, key, attrs[key]))


def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.mark.slow
def test_site_builds_strictly(site):
    assert (site / "index.html").is_file()


@pytest.mark.slow
def test_site_shows_library_prints(site):
    """`result.summary()` prints from inside the library; docs/hooks.py puts it on the page."""
    quickstart = _html_of(site, "getting-started/quickstart.md")
    assert "128 chains on 4 device(s)" in quickstart
    assert "along these lines" not in quickstart  # no hand-written sample output
    home = _html_of(site, "index.md")
    assert re.search(r"\[-7\. +-5\. +-3\.", home), "print(f(...)) of the home page not shown"


@pytest.mark.slow
def test_site_pictures_are_drawn_at_build_time(site):
    pictures = {
        "getting-started/quickstart.md": 1,
        "tutorials/subclassing.md": 1,
        "tutorials/optax.md": 2,
        "tutorials/diagnostics.md": 3,
    }
    for page, count in pictures.items():
        shown = re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', _html_of(site, page))
        assert len(shown) == count, f"{page} shows {len(shown)} pictures, expected {count}"


@pytest.mark.slow
def test_site_math_renders_without_a_network(site):
    diagnostics = _html_of(site, "tutorials/diagnostics.md")
    assert "<math" in diagnostics and "arithmatex" not in diagnostics
    assert "\\(" not in diagnostics  # no TeX left for a script to typeset


@pytest.mark.slow
def test_site_has_no_external_resources(site):
    """Scripts, stylesheets, fonts and pictures all come with the site (links may point
    anywhere: following one is the reader's choice)."""
    external = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
    problems = []
    for path in sorted(site.rglob("*.html")):
        for tag, key, value in _parse(path).refs:
            if tag == "a" or (tag == "link" and key == "href" and "canonical" in value):
                continue
            if external.match(value):
                problems.append(f"{path.relative_to(site)}: <{tag} {key}={value!r}>")
    css_url = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"'])(?P<url>[^\"')\s]+)")
    for path in sorted(site.rglob("*.css")):
        for match in css_url.finditer(path.read_text(encoding="utf-8", errors="replace")):
            if external.match(match["url"]):
                problems.append(f"{path.relative_to(site)}: {match['url']}")
    assert not problems, "external resources:\n" + "\n".join(problems[:40])


@pytest.mark.slow
def test_site_links_and_anchors_resolve(site):
    parsed: dict[Path, _Refs] = {}

    def page(path: Path) -> _Refs:
        if path not in parsed:
            parsed[path] = _parse(path)
        return parsed[path]

    broken = []
    for path in sorted(site.rglob("*.html")):
        for _tag, key, value in page(path).refs:
            if key == "srcset" or value.startswith(("data:", "mailto:", "javascript:")):
                continue
            url = urllib.parse.urlsplit(value)
            if url.scheme or url.netloc:
                continue
            target = path
            if url.path:
                base = site if url.path.startswith("/") else path.parent  # 404.html: absolute
                target = (base / urllib.parse.unquote(url.path).lstrip("/")).resolve()
                if target.is_dir():
                    target = target / "index.html"
                if not target.is_file():
                    broken.append(f"{path.relative_to(site)}: {value} (no such file)")
                    continue
            fragment = urllib.parse.unquote(url.fragment)
            if fragment and target.suffix == ".html" and fragment not in page(target).ids:
                broken.append(f"{path.relative_to(site)}: {value} (no anchor #{fragment})")
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken[:40])
