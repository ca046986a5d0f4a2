"""Every Python code block of the documentation runs, and shown output is checked.

* Fenced ```` ```python ```` (or ```` ```pycon ````) blocks are collected from
  ``docs/**/*.md`` and from ``README.md``.  The blocks of one page run in order
  in one shared namespace, so a page can build up an example; one test per
  block (running a single block first runs the page's earlier blocks).
* A block whose first line starts with ``>>>`` is a doctest: its shown output
  is compared (``NORMALIZE_WHITESPACE``, ``ELLIPSIS``).  Other blocks are run
  with ``exec``; a block that shows output must check it itself (asserts).
* Optional dependencies: a block that imports one of :data:`OPTIONAL` (``torch``,
  ``torchrl``, ``cupy``, ``dask``, ``gymnasium``, ...) is skipped when that import fails, and a
  comment ``<!-- requires: gpu, torch -->`` on the line(s) before a block adds
  requirements (``gpu``: a CUDA device usable by CuPy; ``torch-cuda``: PyTorch
  with CUDA).  A block needing a GPU never runs on a machine without one.
* The docstring examples of the public API (rendered on the API page) run as
  doctests too.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The documentation does not depend on the backend selection: run it once, in the
# CPU pass, not again in CI's pass under Numba's CUDA simulator.
pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"),
    reason="documentation checks run in the CPU pass (not under the CUDA simulator)",
)

OPTIONAL = {"torch", "torchrl", "tensordict", "cupy", "dask", "distributed", "gymnasium",
            "stable_baselines3", "gpu", "torch-cuda"}

# README's quickstart block uses arrays the reader already has; give it some.
README_SETUP = """
import numpy as np
_rng = np.random.default_rng(0)
B, T = 4, 64
rewards = _rng.standard_normal((B, T)).astype(np.float32)
values = _rng.standard_normal((B, T)).astype(np.float32)
next_values = _rng.standard_normal((B, T)).astype(np.float32)
terminated = _rng.random((B, T)) < 0.02
truncated = (_rng.random((B, T)) < 0.02) & ~terminated
dones = terminated | truncated
a = np.full((B, T), 0.9, dtype=np.float32)
b = rewards
"""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*$")
_REQUIRES = re.compile(r"<!--\s*requires:\s*(?P<names>[\w ,-]+?)\s*-->")


@dataclass
class Block:
    page: str
    index: int
    line: int
    code: str
    requires: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}(L{self.line})"

    @property
    def is_doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")


def fences(text: str) -> list[tuple[str, int, str, set[str]]]:
    """Every fenced code block of a markdown text: ``(language, line, code, requires)``."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        close = re.compile(rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        requires: set[str] = set()
        k = i - 1
        while k >= 0 and (not lines[k].strip() or _REQUIRES.search(lines[k])):
            rm = _REQUIRES.search(lines[k])
            if rm:
                requires |= {n.strip() for n in rm["names"].split(",") if n.strip()}
            k -= 1
        found.append((lang, i + 1, "\n".join(body) + "\n", requires))
        i = j + 1
    return found


def extract_blocks(text: str, page: str) -> list[Block]:
    """The ```python / ```pycon blocks of a markdown text, with their requirements."""
    blocks: list[Block] = []
    for lang, line, code, requires in fences(text):
        if lang in ("python", "py", "pycon"):
            blocks.append(Block(page, len(blocks), line, code, requires))
    return blocks


def imported_modules(code: str) -> set[str]:
    """Top-level names of the modules a block imports."""
    if code.lstrip().startswith(">>>"):
        code = "\n".join(ex.source for ex in doctest.DocTestParser().get_examples(code))
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@cache
def available(name: str) -> bool:
    if name == "gpu":
        try:
            import cupy

            return cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:
            return False
    if name == "torch-cuda":
        try:
            import torch

            return bool(torch.cuda.is_available())
        except Exception:
            return False
    if name == "cupy":
        return available("gpu")
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True


def requirements(block: Block) -> set[str]:
    return block.requires | (imported_modules(block.code) & OPTIONAL)


def missing(block: Block) -> list[str]:
    return sorted(n for n in requirements(block) if not available(n))


def pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def all_blocks() -> list[Block]:
    out = []
    for path in pages():
        out += extract_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return out


BLOCKS = all_blocks()
_BY_PAGE: dict[str, list[Block]] = {}
for _b in BLOCKS:
    _BY_PAGE.setdefault(_b.page, []).append(_b)


def _fresh_namespace(page: str) -> dict:
    ns: dict = {"__name__": f"docs:{page}"}
    if page == "README.md":
        exec(compile(README_SETUP, "README setup", "exec"), ns)
    return ns


def run_block(block: Block, ns: dict) -> None:
    """Run one block in ``ns``; errors point at the block's lines in the markdown file."""
    filename = str(ROOT / block.page)
    if block.is_doctest:
        parser = doctest.DocTestParser()
        test = parser.get_doctest(block.code, ns, block.id, filename, block.line)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
        out: list[str] = []
        runner.run(test, out=out.append, clear_globs=False)
        ns.update(test.globs)  # DocTest works on a copy of the namespace
        if runner.failures:
            pytest.fail(f"doctest failed in {block.id}:\n" + "".join(out), pytrace=False)
    else:
        exec(compile("\n" * block.line + block.code, filename, "exec"), ns)


# page -> (namespace, index of the next block to run)
_STATE: dict[str, tuple[dict, int]] = {}


@pytest.fixture(autouse=True)
def _numpy_print_defaults():
    with np.printoptions(legacy=False):
        yield


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block(block: Block) -> None:
    gone = missing(block)
    if gone:
        pytest.skip(f"needs {', '.join(gone)}")
    ns, nxt = _STATE.get(block.page, (None, 0))
    if ns is None or nxt > block.index:
        ns, nxt = _fresh_namespace(block.page), 0
    _STATE[block.page] = (ns, block.index + 1)
    try:
        # Run the page's earlier blocks first (when this block runs alone, or after a failure).
        for earlier in _BY_PAGE[block.page][nxt:block.index]:
            if not missing(earlier):
                run_block(earlier, ns)
        run_block(block, ns)
    except NameError as exc:
        skipped = [b for b in _BY_PAGE[block.page][:block.index] if missing(b)]
        if skipped:  # it builds on an earlier block that could not run here
            pytest.skip(f"builds on {skipped[-1].id}, which needs {', '.join(missing(skipped[-1]))} ({exc})")
        raise
    except BaseException:
        _STATE.pop(block.page, None)
        raise


def test_docs_have_code() -> None:
    """The collector finds the pages' code (a broken fence regex would silently test nothing)."""
    pages_with_code = {b.page for b in BLOCKS}
    for page in ("docs/getting-started.md", "docs/semantics.md", "docs/recipes/torchrl.md",
                 "docs/recipes/sb3-cleanrl.md", "docs/recipes/rlhf.md", "docs/recipes/packed.md"):
        assert page in pages_with_code, page


def test_every_fenced_python_block_is_collected() -> None:
    """No Python code hides in a block the collector would miss (an unlabelled fence
    holding ``import`` lines or ``>>>`` prompts)."""
    for path in pages():
        for lang, line, code, _ in fences(path.read_text(encoding="utf-8")):
            if lang in ("", "text", "console"):
                assert not re.search(r"^\s*(import \w|from \w+ import |>>> )", code, re.M), (
                    f"{path.name}:{line}: this fence holds Python; label it ```python"
                )


def test_extractor() -> None:
    text = (
        "x\n<!-- requires: gpu -->\n\n```python\nimport cupy\n```\n"
        "=== \"tab\"\n\n    ```python\n    y = 1\n    ```\n```text\nno\n```\n"
    )
    bs = extract_blocks(text, "t.md")
    assert [b.code for b in bs] == ["import cupy\n", "y = 1\n"]
    assert bs[0].requires == {"gpu"} and requirements(bs[0]) == {"gpu", "cupy"}
    assert bs[1].requires == set()


def test_api_docstring_examples() -> None:
    """The ``Examples`` sections shown on the API reference page (every module that
    defines a public name)."""
    import gaescan

    modules = {sys.modules[getattr(gaescan, n).__module__] for n in gaescan.__all__
               if hasattr(getattr(gaescan, n), "__module__")}
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    tests = [t for m in sorted(modules, key=lambda m: m.__name__) for t in finder.find(m) if t.examples]
    assert tests
    out: list[str] = []
    for t in tests:
        runner.run(t, out=out.append)
    assert not runner.failures, "".join(out)


def test_semantics_diagram_is_current() -> None:
    """``docs/img/semantics.svg`` is what ``docs/_ext/diagrams.py`` draws."""
    import runpy

    draw = runpy.run_path(str(ROOT / "docs" / "_ext" / "diagrams.py"))["draw"]
    assert (ROOT / "docs" / "img" / "semantics.svg").read_text(encoding="utf-8") == draw(), (
        "run: python docs/_ext/diagrams.py"
    )


def test_griffe_extension_rewrites_sphinx_markup() -> None:
    """The docs build's docstring rewriting (``docs/_ext/griffe_math.py``)."""
    pytest.importorskip("griffe")
    import runpy

    ext = runpy.run_path(str(ROOT / "docs" / "_ext" / "griffe_math.py"))
    doc = "Text.\n\n.. math::\n\n    a &= b \\\\\n    c &= d\n\nMore, see :func:`~gaescan.gae`.\n"
    out = ext["convert_roles"](ext["convert"](doc), {"gae"})
    assert "$$\n\\begin{aligned}\na &= b \\\\\nc &= d\n\\end{aligned}\n$$" in out
    assert "[`gae`][gaescan.gae]" in out and ".. math::" not in out
    assert ext["convert_roles"](":func:`gaescan._config.override`", {"gae"}) == "`gaescan._config.override`"
