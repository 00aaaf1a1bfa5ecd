"""The layers, read from the source: `ensemblenn` never imports `samplers`; `samplers` (and
the benchmarks) use only `ensemblenn`'s public names; no module reaches into another
package's private modules (a package's own `__init__` re-exports them); a test that imports
a private module says why, on that line or the one above."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ensemblenn", "samplers")
CONSUMERS = ("tests", "benchmarks")  # may reach in, saying why


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str | None = None) -> list[tuple[int, str]]:
    """(line, dotted module) of every module `path` (the module `name`) imports, relative
    imports resolved and `from package import _module` counted as the module."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    sub = f"{base}.{alias.name}"
                    if base.split(".")[0] in PACKAGES and _is_module(sub):
                        found.append((node.lineno, sub))
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError):  # a function's name, not a module's
        return False


def _private_owner(module: str) -> str | None:
    """The package that owns `module`'s first private part (`samplers.driver` for
    `samplers.driver._verdict`), or None when every part is public."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _sources(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reaches_into_another_packages_private_modules(path):
    importer = _module_name(path)
    wrong = []
    for line, module in _imports(path):
        top = module.split(".")[0]
        if importer.startswith("ensemblenn") and top != "ensemblenn" and top in PACKAGES:
            wrong.append(f"line {line}: {module} (the framework never imports its users)")
        owner = _private_owner(module)
        if owner is None or top not in PACKAGES:
            continue
        inside = importer == owner or importer.startswith(owner + ".")
        if not inside and not (path.name == "__init__.py" and importer == owner):
            wrong.append(f"line {line}: {module} is private to {owner}")
    assert not wrong, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(wrong)


def test_a_test_or_benchmark_that_imports_a_private_module_says_why():
    unexplained = []
    for path in _sources(*CONSUMERS):
        lines = path.read_text(encoding="utf-8").splitlines()
        for line, module in _imports(path):
            if _private_owner(module) is None or module.split(".")[0] not in PACKAGES:
                continue
            here, above = lines[line - 1], lines[line - 2] if line > 1 else ""
            if "#" not in here and not above.lstrip().startswith("#"):
                unexplained.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not unexplained, "\n".join(unexplained)


def test_the_checks_see_a_reach_into_private_modules(tmp_path):
    """The import reader resolves a relative import of another package's private module."""
    probe = tmp_path / "_probe.py"
    probe.write_text("from ..driver._verdict import verdict_of\nfrom ..driver import _run\n")
    found = [m for _, m in _imports(probe, "samplers.cli._probe")]
    assert found == ["samplers.driver._verdict", "samplers.driver", "samplers.driver._run"]
    assert _private_owner("samplers.driver._verdict") == "samplers.driver"
    assert _private_owner("samplers._errors") == "samplers"  # a subpackage may use it
