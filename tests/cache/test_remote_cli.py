"""``tunetree cache ls|verify|gc --remote`` and ``push``/``pull`` against a real S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tunetree as tt
from tunetree.cache.sealing import seal, secret_from_env
from tunetree.cache.store import decode_manifest, encode_manifest
from tunetree.cli import main

from . import fakes
from .remote_helpers import objects, put, tune_tree


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(["cache", *argv])
    return status, capsys.readouterr().out


def test_push_a_model_then_pull_it_on_another_host(
    tmp_path: Path, remote: str, s3_server, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tune_tree(tt.TuningCache(tmp_path / "a", remote=False))  # tuned before the remote
    assert local["remote_stored"] == 0 and len(local["builds"]) == 5
    status, out = _run(
        capsys, "--dir", str(tmp_path / "a"), "push", "--model", "Other", "--remote", remote
    )
    assert status == 0 and out.startswith("0 of 0 selected")
    status, out = _run(
        capsys, "--dir", str(tmp_path / "a"), "push", "--model", "Tree", "--remote", remote
    )
    assert status == 0 and out.startswith("5 of 5 selected entries copied"), out
    status, out = _run(capsys, "ls", "--remote", remote, "--json")
    listed = json.loads(out)
    assert status == 0 and sorted(i["path"] for i in listed) == ["", "a", "a.lin", "b", "b.lin"]
    assert all(i["problem"] is None and i["signed"] for i in listed)  # with the fleet's key
    status, out = _run(capsys, "--dir", str(tmp_path / "b"), "pull", "--all", "--remote", remote)
    assert status == 0 and out.startswith("5 of 5 selected entries copied"), out
    offline = tune_tree(tt.TuningCache(tmp_path / "b", remote=False))
    assert offline["builds"] == [] and offline["hits"] == 5 and offline["ok"]


def test_a_model_object_selects_exactly_its_own_entries(tmp_path: Path, remote: str) -> None:
    cache = tt.TuningCache(tmp_path / "a", remote=remote)
    tune_tree(tt.TuningCache(tmp_path / "a", remote=False), depths=(0, 1))
    other = fakes.tree(seed=0)
    other.b = fakes.Leaf(16)  # another structure below the root: its entries are not this one's
    assert cache.push(other).selected == 1  # only `a` is shared (same path, same structure)
    report = cache.push(fakes.tree())
    assert (report.selected, report.copied) == (3, 2)


def test_verify_finds_a_corrupted_artifact_and_gc_removes_its_entry(
    tmp_path: Path, remote: str, s3_server, capsys: pytest.CaptureFixture[str]
) -> None:
    tune_tree(tt.TuningCache(tmp_path / "a", remote=remote), depths=(0,))
    assert _run(capsys, "verify", "--remote", remote)[0] == 0
    artifacts = objects(s3_server, remote, "artifacts")
    name = max(artifacts, key=lambda n: len(artifacts[n]))
    put(s3_server, remote, "artifacts", name, artifacts[name][:-1] + b"\x00")
    status, out = _run(capsys, "verify", "--remote", remote)
    assert status == 1 and "CORRUPT" in out and "is corrupted" in out
    status, out = _run(capsys, "gc", "--remote", remote, "--grace", "0", "--deep")
    assert status == 0 and out.startswith("removed 1 unusable entries and 2 unreferenced")
    assert objects(s3_server, remote, "entries") == {} == objects(s3_server, remote, "artifacts")


def test_remote_commands_without_a_remote_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "ls", "--remote"]) == 2
    assert "no remote" in capsys.readouterr().err


def test_pull_leaves_entries_of_another_kind_of_machine_where_they_are(
    tmp_path: Path, remote: str, s3_server
) -> None:
    tune_tree(tt.TuningCache(tmp_path / "a", remote=remote), depths=(0,))
    ((key, envelope),) = objects(s3_server, remote, "entries").items()
    manifest = decode_manifest(envelope.split(b"\n", 3)[3], key)
    manifest.hard = {**manifest.hard, "cpu.model": "A CPU of another kind"}
    put(s3_server, remote, "entries", key, seal(key, encode_manifest(manifest), secret_from_env()))
    report = tt.TuningCache(tmp_path / "b", remote=remote).pull()
    assert (report.selected, report.copied) == (1, 0)
    assert "another kind of machine (cpu.model differ)" in report.skipped[0][1]
