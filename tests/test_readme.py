"""The README opens with what tunetree does and how to install it, and its first Python block
runs as written (extracted from the file, run in a fresh interpreter in an empty directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_opens_with_what_it_does_and_pip_install() -> None:
    text = README.read_text()
    first_heading = text.index("## ")
    assert "without changing what the model computes" in text[:first_heading]
    install = text.index('pip install "tunetree[')
    assert install < text.index("make demo") < text.index("make test")
    for extra in ("cpu", "cuda", "intel-gpu", "all"):
        assert f'pip install "tunetree[{extra}]"' in text[: text.index("## First use")]


def test_the_extras_named_by_the_readme_exist_and_all_holds_every_optional_one() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    text = README.read_text()
    for named in re.findall(r'pip install "tunetree\[([a-z-]+)\]"', text):
        assert named in extras, named
    everything = extras["all"][0]
    for extra in ("openvino", "onnx", "ao", "plot", "remote", "fleet", "hf", "serve"):
        assert extra in everything, extra


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_the_readme_first_python_block_runs_as_written(tmp_path: Path) -> None:
    block = python_blocks(README.read_text())[0]
    script = tmp_path / "readme_block.py"
    script.write_text(block)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNETREE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "encoder.tt").is_file()
    assert "depth" in proc.stdout


def test_the_package_layout_section_names_every_room_and_top_level_module() -> None:
    text = README.read_text()
    section = text[text.index("## Package layout") :]
    section = section[: section.index("\n## ")]
    package = ROOT / "tunetree"
    rooms = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    missing = sorted(room for room in rooms if f"`{room}/`" not in section)
    assert not missing, f"rooms the README's table leaves out: {missing}"
    top = {p.name for p in package.glob("*.py")}
    assert not [name for name in top if f"`{name}`" not in section], top


def test_the_package_layout_table_lists_rooms_top_to_bottom_as_the_import_contract() -> None:
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["id"] == "rooms")["layers"]
    order = [re.split(r"[ :|]+", layer)[0].removeprefix("tunetree.") for layer in layers]
    text = README.read_text()
    section = text[text.index("## Package layout") :]
    table = re.findall(r"(?m)^\| `([a-z_]+)/`", section[: section.index("\n## ")])
    ranks = [order.index(room) for room in table]
    assert ranks == sorted(ranks), list(zip(table, ranks, strict=True))


def test_every_section_the_readme_points_to_exists() -> None:
    text = README.read_text()
    headings = set(re.findall(r"(?m)^#+ (.+)$", text))
    pointed = re.findall(r'\b[Ss]ee "([^"]+)"', text)
    assert pointed  # the scan reads them
    assert not [name for name in pointed if name not in headings], pointed
