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


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def test_the_architecture_doc_draws_every_room_and_names_only_real_modules() -> None:
    import re

    text = ARCHITECTURE.read_text()
    diagram = text.split("```")[1]
    drawn = set(re.findall(r"(?m)^ ?([a-z_]+)\b", diagram))  # a room per line, first word
    drawn |= set(re.findall(r"\b([a-z_]+)/", diagram))  # and those beside it (cache/ : checkpoint/)
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert rooms <= drawn, rooms - drawn
    paths = set(re.findall(r"`([a-z_]+/[a-z_]+)(?:\.py)?`", text))
    assert len(paths) > 10  # the scan reads them
    missing = sorted(
        path
        for path in paths
        if not (PACKAGE / f"{path}.py").exists() and not (PACKAGE / path).is_dir()
    )
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_architecture_doc_names_every_module() -> None:
    """A module the doc leaves out is one a reader cannot place: a line for it in its room."""
    import re

    text = ARCHITECTURE.read_text()
    modules = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.parent != PACKAGE
    )
    assert len(modules) > 100
    unnamed = [m for m in modules if not re.search(rf"\b{Path(m).stem}\b", text)]
    assert not unnamed, f"add a line for these to docs/architecture.md: {unnamed}"
