"""The house keeps its shape: entry points at the top, rooms below, no grab-bags."""

from __future__ import annotations

import ast
from pathlib import Path

import tunetree as tt

PACKAGE = Path(tt.__file__).parent
TOP_LEVEL = {"__init__.py", "errors.py", "_version.py", "cli.py", "demo.py", "__main__.py"}
MAX_LINES = 700


def test_only_entry_points_sit_at_the_top() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} <= TOP_LEVEL


def test_no_module_is_a_grab_bag() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_room_is_a_package_with_a_docstring() -> None:
    rooms = [p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(rooms) >= 9
    for room in rooms:
        init = room / "__init__.py"
        assert init.exists(), room.name
        assert init.read_text().lstrip().startswith('"""'), f"{room.name} says what it holds"


MAX_CLASS_LINES = 250
MAX_INIT_LINES = 60


def _classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [
            (f"{path.relative_to(PACKAGE)}:{node.name}", node)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
        ]
    return found


def _lines(node: ast.AST) -> int:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return (node.end_lineno or node.lineno) - first + 1


def test_no_class_is_a_grab_bag() -> None:
    long = {name: n for name, node in _classes() if (n := _lines(node)) > MAX_CLASS_LINES}
    assert not long, f"classes over {MAX_CLASS_LINES} lines: {long}"


def test_no_init_does_everything() -> None:
    long = {
        name: n
        for name, node in _classes()
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == "__init__"
        if (n := _lines(item)) > MAX_INIT_LINES
    }
    assert not long, f"__init__ over {MAX_INIT_LINES} lines: {long}"
