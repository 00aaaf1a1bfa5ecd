"""A griffe extension for the API reference: read `Example:` sections as examples.

The library's Google-style docstrings title their doctests `Example:`. Griffe only knows the
plural, `Examples:`, and renders any other title as an admonition whose text is Markdown, so
the `>>>` lines would come out as nested block quotes. This extension renames the section
before griffe parses the docstring, so the doctests render as highlighted code.
"""

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename `Example:` section titles to `Examples:` in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _rename(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _rename(pkg)  # a top-level package is not passed to on_object


def _rename(obj: griffe.Object) -> None:
    docstring = obj.docstring
    if docstring is not None and "Example:" in docstring.value:
        docstring.value = _EXAMPLE.sub(r"\g<indent>Examples:", docstring.value)
