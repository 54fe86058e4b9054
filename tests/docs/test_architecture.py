"""The architecture page (docs/concepts/architecture.md) holds against the code: every
module under aiopurgatory/ is named on it, and the structure its picture is drawn from
has floors (no cycle of imports made when a module loads, so no arrow back up)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "scripts"))

import structure  # noqa: E402

PAGE = ROOT / "docs" / "concepts" / "architecture.md"


def test_every_module_is_named_on_the_architecture_page() -> None:
    named = set(re.findall(r"`(aiopurgatory(?:\.\w+)*)`", PAGE.read_text()))
    missing = [module for module in structure.modules() if module not in named]
    assert missing == [], f"not named on {PAGE.relative_to(ROOT)}: {missing}"
    stale = sorted(named - set(structure.modules()))
    assert stale == [], f"named on the page but not a module: {stale}"


def test_the_rooms_have_floors_and_every_eager_arrow_points_down() -> None:
    rooms = structure.rooms()  # ValueError on a cycle
    assert min(room.floor for room in rooms.values()) == 1
    for room in rooms.values():
        for other in room.eager:
            assert rooms[other].floor < room.floor, (room.name, other)
    # The arrows the page's rules name: the purgatory's plugin knows nothing of Kafka,
    # the analysis nothing of the command line above it.
    assert "aiopurgatory.kafka" not in rooms["aiopurgatory.pytest_plugin"].eager
    analysis = rooms["aiopurgatory.analysis"]
    assert "aiopurgatory.cli" not in analysis.eager | analysis.lazy


def test_a_cycle_has_no_floors() -> None:
    a = structure.Room("a", ["a"], 1, eager={"b"})
    b = structure.Room("b", ["b"], 1, eager={"a"})
    with pytest.raises(ValueError, match="a -> b -> a"):
        structure.floors({"a": a, "b": b})


def test_the_picture_names_every_room() -> None:
    svg = structure.structure_svg()
    assert svg.startswith("<svg")
    for name in structure.rooms():
        label = name.removeprefix("aiopurgatory.")
        assert f">{label}" in svg, name
