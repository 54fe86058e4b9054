"""A Griffe extension: the docstrings' Sphinx markup reads as code in the API reference.

The docstrings are written for ``help()`` and for readers of the source, with Sphinx
cross-reference roles (``:class:`~aiopurgatory.Purgatory```, ``:meth:`advance```).
Markdown has no roles, so mkdocstrings would print ``:class:`` before the name: this
turns each role into inline code of the name it shows (the last dotted part after a
``~``, the label of ``label <target>``).
"""

from __future__ import annotations

import re
from typing import Any, Final

import griffe

ROLE: Final = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):`([^`]+)`")


def _shown(target: str) -> str:
    label = re.fullmatch(r"(?P<label>.+?)\s*<[^>]+>", target)
    if label:
        return label["label"]
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


LITERAL_ALONE: Final = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)
LITERAL_AFTER: Final = re.compile(r"(?<=\S)::$", re.MULTILINE)


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role replaced by inline code of what it shows.

    An rST literal-block marker (``::`` ending a line, or alone on one) goes too: the
    indented block after it is a code block in Markdown already.
    """
    text = LITERAL_ALONE.sub("", text)
    text = LITERAL_AFTER.sub(":", text)
    return ROLE.sub(lambda m: f"``{_shown(m[1])}``", text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
