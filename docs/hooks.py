"""Build hooks: the small pieces that markdown-exec and arithmatex do not cover.

The pages' code is executed by markdown-exec (```` ```python exec="on" ... ```` blocks, one
`session` per page, in the mkdocs process). This file adds three things around it:

* the environment the pages run in: CPU JAX with 4 simulated devices (set before any page
  imports jax), a file-only matplotlib backend, and JAX's persistent compilation cache under
  `build/docs-jax-cache/` (git-ignored), so a second build skips most compilation;
* the library's own prints on the page: markdown-exec captures the `print` calls of a block,
  not the ones made inside a library (`result.summary()` prints its table), so each block
  also runs with `sys.stdout` sent to the same buffer;
* math without a network: the TeX that `pymdownx.arithmatex` leaves in the HTML is converted
  to MathML by `latex2mathml` at build time, which browsers render natively (no script, no
  web font).
"""

from __future__ import annotations

import contextlib
import html
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_DEVICES = 4

_INLINE = re.compile(r'<span class="arithmatex">\\\((?P<tex>.*?)\\\)</span>', re.DOTALL)
_DISPLAY = re.compile(r'<div class="arithmatex">\\\[(?P<tex>.*?)\\\]</div>', re.DOTALL)
# What markdown-exec renders for a block's output when the block printed nothing (a
# source block is never empty).
_EMPTY_OUTPUT = re.compile(r'<div class="highlight"><pre><span></span><code>\s*</code></pre></div>')


def on_startup(**kwargs) -> None:  # noqa: ARG001 - mkdocs hook signature
    """Set the pages' environment before anything imports jax, and capture library prints."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={NUM_DEVICES}"
    # The folder tests/test_docs.py gives the pages too (also when the test suite builds).
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(ROOT / "build" / "docs-jax-cache")
    _capture_stdout()


def _capture_stdout() -> None:
    # markdown-exec hands each block a `print` bound to the block's output buffer; sending
    # sys.stdout to that buffer too puts prints made inside the library on the page. The test
    # tests/test_docs.py (test_hook_puts_library_prints_on_the_page) fails if markdown-exec
    # moves this.
    from markdown_exec._internal.formatters import python as exec_python_module

    run = exec_python_module.exec_python
    if getattr(run, "_ensemblenn_captures_stdout", False):
        return

    def exec_python(code: str, filename: str, exec_globals: dict | None = None) -> None:
        buffer = exec_globals["print"].args[0]  # functools.partial(_buffer_print, buffer)
        with contextlib.redirect_stdout(buffer):
            run(code, filename, exec_globals)

    exec_python._ensemblenn_captures_stdout = True
    exec_python_module.exec_python = exec_python


def mathml(tex: str, display: bool) -> str:
    """One TeX formula as MathML."""
    from latex2mathml.converter import convert

    return convert(tex.strip(), display="block" if display else "inline")


def on_page_content(content: str, **kwargs) -> str:  # noqa: ARG001 - mkdocs hook signature
    """Replace arithmatex's TeX placeholders by MathML; drop the empty output boxes of
    blocks that print nothing."""
    content = _EMPTY_OUTPUT.sub("", content)
    content = _DISPLAY.sub(lambda m: mathml(html.unescape(m["tex"]), True), content)
    return _INLINE.sub(lambda m: mathml(html.unescape(m["tex"]), False), content)
