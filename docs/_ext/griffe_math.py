"""Griffe extension for the docs build: render numpydoc ``.. math::`` blocks.

The public docstrings use the Sphinx/numpydoc ``.. math::`` directive, which
Markdown does not know.  This turns each such block into a ``$$ ... $$``
display block (for ``pymdownx.arithmatex`` and MathJax), wrapping multi-line
math in ``aligned``.  The source is not changed; only what the site shows.
"""

from __future__ import annotations

import re
import textwrap

import griffe

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
    """Rewrite ``.. math::`` directives in every loaded docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: ARG002
        if obj.docstring is not None and ".. math::" in obj.docstring.value:
            obj.docstring.value = convert(obj.docstring.value)
