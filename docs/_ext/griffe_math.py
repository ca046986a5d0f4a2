"""Griffe extension for the docs build: render the Sphinx markup of numpydoc docstrings.

The public docstrings are numpydoc, written with two pieces of Sphinx markup
that Markdown does not know:

* ``.. math::`` blocks become ``$$ ... $$`` display blocks (for
  ``pymdownx.arithmatex`` and MathJax), multi-line math wrapped in ``aligned``;
* roles such as ``:func:`~gaescan.gae``` become links to the API reference
  (mkdocs-autorefs) when they name a public object of ``gaescan``, and inline
  code otherwise.

The source is not changed; only what the site shows.
"""

from __future__ import annotations

import re
import textwrap

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|data|mod|meth|attr|obj):`(?P<tilde>~?)(?P<target>[\w.]+)`")


def _public_names() -> set[str]:
    try:
        import gaescan
    except ImportError:  # the docs build reads the source; the package need not import
        return set()
    return set(getattr(gaescan, "__all__", ()))


def convert_roles(doc: str, public: set[str]) -> str:
    def repl(m: re.Match) -> str:
        target = m["target"]
        short = target.rsplit(".", 1)[-1]
        shown = short if m["tilde"] else target
        if short in public and target in (short, f"gaescan.{short}"):
            return f"[`{shown}`][gaescan.{short}]"
        return f"`{shown}`"

    return _ROLE.sub(repl, doc)

_MATH = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n(?P<body>(?:(?:(?P=indent)[ \t]+.*)?\n)+)", re.M)


def convert(doc: str) -> str:
    def repl(m: re.Match) -> str:
        indent = m["indent"]
        body = textwrap.dedent(m["body"]).strip()
        if "\\\\" in body:
            body = "\\begin{aligned}\n" + body + "\n\\end{aligned}"
        block = "$$\n" + body + "\n$$"
        return textwrap.indent(block, indent) + "\n\n"

    return _MATH.sub(repl, doc if doc.endswith("\n") else doc + "\n")


class MathBlocks(griffe.Extension):
    """Rewrite ``.. math::`` directives and cross-reference roles in every loaded docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.public = _public_names()

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: ARG002
        if obj.docstring is None:
            return
        doc = obj.docstring.value
        if ".. math::" in doc:
            doc = convert(doc)
        if ":`" in doc:
            doc = convert_roles(doc, self.public)
        obj.docstring.value = doc
