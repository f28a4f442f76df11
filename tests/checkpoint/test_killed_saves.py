"""Saves killed halfway (issue 29): a directory checkpoint is never lost at its path, and what
a killed save left beside it is cleaned up by the next save or load.

Before, a directory save moved the old checkpoint aside (``<name>.old-<pid>-<hex>``) and then
renamed the new one in: killed between the two renames, no checkpoint existed at the path and
``tt.load(path)`` failed; and every killed save left its staging files, which nothing removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tests.checkpoint.test_checkpoint import assert_same, data, outputs, tiny

ROOT = Path(__file__).resolve().parents[2]


def _siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name != target.name)


def _killed_between_the_renames(target: Path, *, compress: bool, swap: bool) -> None:
    """Save ``tiny(seed=5)`` over ``target`` in a child process that is killed right after
    the old checkpoint was moved aside (``swap=False``: without an atomic exchange), or
    right before the new one is put in place (``swap=True``)."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import tunetree as tt
        from tunetree.checkpoint import writer
        from tests.checkpoint.test_checkpoint import tiny

        real_rename = os.rename
        if {swap!r}:
            def killed(tmp, target):
                os.kill(os.getpid(), signal.SIGKILL)
            writer.install = writer._install = killed  # (the name before issue 29)
        else:
            try:
                from tunetree.checkpoint import staging
                staging.exchange = lambda a, b: False  # rename aside, not swap
            except ImportError:  # before issue 29: always renamed aside
                pass
            def rename(src, dst):
                real_rename(src, dst)
                if ".old-" in str(dst):  # the old checkpoint is aside: die now
                    os.kill(os.getpid(), signal.SIGKILL)
            os.rename = rename
        tt.save(tiny(seed=5), {str(target)!r}, compress_checkpoint={compress!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def test_a_directory_save_killed_between_its_renames_is_recovered_by_the_next_load(
    tmp_path: Path,
) -> None:
    target = tmp_path / "model.ttdir"
    tt.save(tiny(), target, compress_checkpoint=False)
    expected = outputs(tiny(), data())
    _killed_between_the_renames(target, compress=False, swap=False)
    assert not target.exists()  # what the kill left: the old copy aside, the staging
    left = _siblings(target)
    assert any(".old-" in n for n in left) and any(".tmp-" in n for n in left), left
    assert_same(outputs(tt.load(tiny(seed=8), target), data()), expected)
    assert _siblings(target) == []  # put back, and the dead writer's staging removed


def test_a_directory_save_killed_between_its_renames_is_recovered_by_the_next_save(
    tmp_path: Path,
) -> None:
    target = tmp_path / "model.ttdir"
    tt.save(tiny(), target, compress_checkpoint=False)
    _killed_between_the_renames(target, compress=False, swap=False)
    tt.save(tiny(seed=3), target, compress_checkpoint=False)
    assert _siblings(target) == []
    assert_same(outputs(tt.load(tiny(seed=8), target), data()), outputs(tiny(seed=3), data()))


@pytest.mark.parametrize("compress", [True, False])
def test_staging_files_of_killed_saves_are_removed_by_the_next_save(
    compress: bool, tmp_path: Path
) -> None:
    target = tmp_path / ("model.tt" if compress else "model.ttdir")
    tt.save(tiny(), target, compress_checkpoint=compress)
    _killed_between_the_renames(target, compress=compress, swap=True)
    assert any(".tmp-" in n for n in _siblings(target))  # the killed writer's
    assert_same(outputs(tt.load(tiny(seed=8), target), data()), outputs(tiny(), data()))
    tt.save(tiny(seed=3), target, compress_checkpoint=compress)
    assert _siblings(target) == []


def test_a_directory_is_swapped_in_one_step_where_the_kernel_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``renameat2(RENAME_EXCHANGE)`` there is no moment without a checkpoint at the path:
    nothing is renamed aside."""
    from tunetree.checkpoint import staging

    target = tmp_path / "model.ttdir"
    tt.save(tiny(), target, compress_checkpoint=False)
    probe_a, probe_b = tmp_path / "a", tmp_path / "b"
    probe_a.mkdir()
    probe_b.write_text("b")
    if not staging.exchange(probe_a, probe_b):
        pytest.skip("this kernel or filesystem cannot exchange two paths")
    assert probe_a.is_file() and probe_b.is_dir()
    probe_a.unlink()
    probe_b.rmdir()
    renamed: list[Any] = []
    real = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renamed.append((a, b)), real(a, b))[1])
    tt.save(tiny(seed=3), target, compress_checkpoint=False)
    assert renamed == [] and _siblings(target) == []
    assert_same(outputs(tt.load(tiny(seed=8), target), data()), outputs(tiny(seed=3), data()))


def test_a_live_writers_files_are_left_alone(tmp_path: Path) -> None:
    """Another process of this host still saving: its staging and old copy are not touched,
    even with the target missing for that instant."""
    from tunetree.checkpoint import staging

    target = tmp_path / "model.ttdir"
    tt.save(tiny(), target, compress_checkpoint=False)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        aside = target.with_name(f"{target.name}.old-{staging.HOST}-{sleeper.pid}-0123abcd")
        staging_dir = target.with_name(f"{target.name}.tmp-{staging.HOST}-{sleeper.pid}-89abcdef")
        os.rename(target, aside)
        staging_dir.mkdir()
        staging.recover(target)
        assert not target.exists() and aside.exists() and staging_dir.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    staging.recover(target)
    assert target.exists() and _siblings(target) == []
    with torch.no_grad():
        assert tt.load(tiny(seed=8), target) is not None
