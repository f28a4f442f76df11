"""Only signed remote entries serve: a backdoored entry resealed without the key never does.

The attack: someone who can write to the bucket but has no key rewrites an entry's ONNX model
to add 7 to its outputs whenever ``max(x) > 50``, and reseals the envelope unsigned. The
samples and value probes a hit is checked on never reach the trigger, so checking against
eager cannot see it; only the signature can. Before, a host without ``TUNETREE_CACHE_KEY``
served the backdoored runner: exact on N(0, 1) inputs, off by 7 on inputs times 100.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tracemalloc
from pathlib import Path

import pytest
import torch

import tunetree as tt
from tunetree.cache.remote import RemoteTier
from tunetree.cache.sealing import KEY_ENV, TRUST_UNSIGNED_ENV

from .remote_helpers import new_cache, objects, put, tune_tree

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

DATA = [torch.randn(4, 8, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
TRIGGERED = DATA[0] * 100.0


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    ).eval()


def _tune(cache: tt.TuningCache) -> tt.TuneResult:
    return tt.tune(
        _model(),
        DATA,
        depth=0,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=cache,
    )


def _with_trigger(model_bytes: bytes) -> bytes:
    """The ONNX model with ``+ 7 * (max(x) > 50)`` on its output (weights left where they are)."""
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    x, out = graph.input[0].name, graph.output[0].name
    for node in graph.node:
        node.output[:] = [f"{out}_clean" if o == out else o for o in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(torch.tensor(50.0).numpy(), "trigger_at"),
            numpy_helper.from_array(torch.tensor(7.0).numpy(), "trigger_add"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("ReduceMax", [x], ["trigger_max"], keepdims=0),
            helper.make_node("Greater", ["trigger_max", "trigger_at"], ["trigger_on"]),
            helper.make_node("Cast", ["trigger_on"], ["trigger_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["trigger_f", "trigger_add"], ["trigger_delta"]),
            helper.make_node("Add", [f"{out}_clean", "trigger_delta"], [out]),
        ]
    )
    return bytes(model.SerializeToString())


def _backdoor(server, url: str) -> None:  # type: ignore[no-untyped-def]
    """Rewrite the remote entry's ONNX model and reseal its envelope unsigned."""
    ((key, envelope),) = objects(server, url, "entries").items()
    magic, key_line, _signature, manifest = envelope.split(b"\n", 3)
    body = json.loads(manifest.split(b"\n", 1)[1])
    files = body["candidates"][body["winner"]]["artifact"]["files"]
    (record,) = [f for f in files if f["path"] == "model.onnx"]
    changed = _with_trigger(objects(server, url, "artifacts")[record["sha256"]])
    record["sha256"], record["size"] = hashlib.sha256(changed).hexdigest(), len(changed)
    put(server, url, "artifacts", record["sha256"], changed)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    checksum = hashlib.sha256(data).hexdigest().encode()
    resealed = b"\n".join([magic, key_line, b"hmac-sha256 unsigned", checksum, data])
    put(server, url, "entries", key, resealed)


def _worst_error(result: tt.TuneResult, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((result.model(x) - _model()(x)).abs().max())


def test_a_backdoored_entry_resealed_unsigned_is_never_served_without_the_key(
    tmp_path: Path, remote: str, s3_server, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    honest = _tune(new_cache(tmp_path, "writer", remote))  # signed with the fleet's key
    assert _worst_error(honest, TRIGGERED) < 1e-3
    _backdoor(s3_server, remote)

    monkeypatch.delenv(KEY_ENV)  # a host without the fleet's key
    cache = new_cache(tmp_path, "keyless", remote)
    with caplog.at_level(logging.WARNING, logger="tunetree"):
        served = _tune(cache)
        served_again = _tune(cache)  # one warning per cache, not per lookup
    assert cache.stats.remote_hits == 0, "the remote's entry was served without a signature"
    assert _worst_error(served, TRIGGERED) < 1e-3 and _worst_error(served_again, TRIGGERED) < 1e-3
    warnings = [r.getMessage() for r in caplog.records if "is not read" in r.getMessage()]
    assert len(warnings) == 1 and KEY_ENV in warnings[0] and TRUST_UNSIGNED_ENV in warnings[0]

    # What trusting unsigned entries risks: the check against eager passes, the trigger fires.
    trusting = new_cache(tmp_path, "trusting", remote, trust_unsigned=True)
    backdoored = _tune(trusting)
    assert trusting.stats.remote_hits == 1 and _worst_error(backdoored, DATA[1]) < 1e-4
    assert _worst_error(backdoored, TRIGGERED) > 6.0

    monkeypatch.setenv(KEY_ENV, "tunetree-test-fleet-key")  # the fleet's hosts refuse it too
    keyed = new_cache(tmp_path, "keyed", remote)
    assert _worst_error(_tune(keyed), TRIGGERED) < 1e-3 and keyed.stats.remote_hits == 0


def test_unsigned_entries_are_read_only_when_trusted_explicitly(
    tmp_path: Path, remote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    writer = tune_tree(new_cache(tmp_path, "writer", remote), depths=(0,))
    assert writer["remote_stored"] == 1  # a host without the key still publishes, unsigned
    refused = tune_tree(new_cache(tmp_path, "default", remote), depths=(0,))
    assert refused["remote_hits"] == 0 and refused["builds"] == ["test-saving:"]
    with pytest.raises(tt.CacheError, match=KEY_ENV):
        new_cache(tmp_path, "pull", remote).pull()  # an explicit pull says why, typed
    trusted = tune_tree(new_cache(tmp_path, "trusted", remote, trust_unsigned=True), depths=(0,))
    assert trusted["remote_hits"] == 1 and trusted["builds"] == []
    monkeypatch.setenv(TRUST_UNSIGNED_ENV, "1")
    from_env = tune_tree(new_cache(tmp_path, "from-env", remote), depths=(0,))
    assert from_env["remote_hits"] == 1 and from_env["builds"] == []


def test_a_15_mib_field_in_an_unsigned_envelope_is_read_in_bounded_memory(
    tmp_path: Path, remote: str, s3_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the reader of such an envelope (trusting unsigned entries) peaked at 2.2 GB."""
    monkeypatch.delenv(KEY_ENV)
    tune_tree(new_cache(tmp_path, "writer", remote), depths=(0,))
    ((key, envelope),) = objects(s3_server, remote, "entries").items()
    magic, key_line, signature, manifest = envelope.split(b"\n", 3)
    body = json.loads(manifest.split(b"\n", 1)[1])
    body["graph_text"] = "x" * (15 << 20)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    checksum = hashlib.sha256(data).hexdigest().encode()
    put(s3_server, remote, "entries", key, b"\n".join([magic, key_line, signature, checksum, data]))
    tier = RemoteTier(remote, trust_unsigned=True)
    tier.client._s3()  # the boto3 client is not the record's cost
    tracemalloc.start()
    try:
        entry = tier.fetch_manifest(key)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(entry.manifest.graph_text) == 15 << 20
    assert peak < 8 * len(data), f"{peak / len(data):.1f} bytes per byte"
