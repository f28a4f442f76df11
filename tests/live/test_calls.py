"""What the JIT keeps: bounded recordings, and calls stored in the cache read as hostile bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from tunetree.cache.decisions import PlannedGraph
from tunetree.cache.sealing import KEY_ENV
from tunetree.live import RecordLimits
from tunetree.live.calls import (
    MalformedCallsError,
    Unstorable,
    decode_calls,
    decode_record,
    encode_calls,
)
from tunetree.live.recorder import Recorder
from tunetree.live.store import CallsStore
from tunetree.search.recorded import RecordedPlan
from tunetree.signature.graph import GraphKey, Sample

KEY = "ab" * 20


def offer(recorder: Recorder, *args: object, **kwargs: object) -> None:
    recorder.offer(GraphKey.of(args, kwargs), args, kwargs)


def test_one_call_per_signature_is_kept_as_a_copy_within_the_count_bound() -> None:
    recorder = Recorder(RecordLimits(max_calls=3, tune_after=2))
    x = torch.zeros(2, 4)
    offer(recorder, x)
    x += 1  # the caller reuses its tensor: the kept call is a copy
    offer(recorder, torch.zeros(2, 4))  # same signature: counted, not kept
    assert len(recorder) == 1 and recorder.calls == 2 and not recorder.ready()
    assert torch.equal(recorder.samples()[0].args[0], torch.zeros(2, 4))
    for rows in (3, 4, 5):
        offer(recorder, torch.zeros(rows, 4))
    assert recorder.ready()
    assert [s.args[0].shape[0] for s in recorder.samples()] == [3, 4, 5]  # oldest dropped


def test_the_byte_bound_holds_and_a_call_larger_than_it_is_never_kept() -> None:
    recorder = Recorder(RecordLimits(max_bytes=100 * 4))
    offer(recorder, torch.zeros(60))
    offer(recorder, torch.zeros(50))  # 440 bytes together: the older goes
    offer(recorder, torch.zeros(101))  # alone over the bound
    assert [s.args[0].numel() for s in recorder.samples()] == [50]
    assert recorder.nbytes == 200


def test_calls_round_trip_through_bytes() -> None:
    samples = [
        Sample((torch.arange(6).reshape(2, 3),), {"mask": torch.ones(2, 3), "scale": 0.5}),
        Sample(
            (),
            {
                "ids": [torch.zeros(1, dtype=torch.int64)],
                "flag": True,
                "dt": torch.float16,
                "name": "x",
                "none": None,
                "pair": (1, 2),
            },
        ),
    ]
    back = decode_calls(encode_calls(samples, KEY), KEY)
    assert [s.key for s in back] == [s.key for s in samples]
    assert torch.equal(back[0].args[0], samples[0].args[0])
    assert back[1].kwargs["pair"] == (1, 2) and back[1].kwargs["dt"] is torch.float16


def test_a_call_holding_an_object_is_not_stored() -> None:
    with pytest.raises(Unstorable, match="object"):
        encode_calls([Sample((torch.zeros(1), object()), {})], KEY)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:5],  # truncated
        lambda b: struct.pack("<Q", 1 << 40) + b[8:],  # a description longer than the data
        lambda b: b.replace(b'"tensor":"0"', b'"tensor":"9"'),  # names a missing tensor
        lambda b: b.replace(b'"schema":2', b'"schema":7'),
        lambda b: b.replace(KEY.encode(), b"cd" * 20),  # made for another key
        lambda b: b.replace(b'"value":0.5', b'"thing":0.5'),
        lambda b: b[:-3],  # safetensors blob cut short
    ],
)
def test_hostile_call_bytes_are_refused_with_a_typed_error(mangle) -> None:
    good = encode_calls([Sample((torch.zeros(2, 2),), {"scale": 0.5})], KEY)
    with pytest.raises(MalformedCallsError):
        decode_calls(mangle(good), KEY)


def test_the_depth_kept_on_the_calls_comes_back_and_a_record_without_one_says_none() -> None:
    samples = [Sample((torch.zeros(2, 2),), {})]
    assert decode_record(encode_calls(samples, KEY, depth=2), KEY)[1] == 2
    assert decode_record(encode_calls(samples, KEY), KEY)[1] is None


PLAN = RecordedPlan(1, [PlannedGraph("encoder", "c" * 64, {"kind": "openvino"}, "f32[2]")], 1.5)


def test_the_plan_kept_on_the_calls_comes_back() -> None:
    samples = [Sample((torch.zeros(2, 2),), {})]
    _, depth, plan = decode_record(encode_calls(samples, KEY, depth=1, plan=PLAN), KEY)
    assert depth == 1 and plan == PLAN
    assert decode_record(encode_calls(samples, KEY, depth=1), KEY)[2] is None


@pytest.mark.parametrize(
    ("good", "bad"),
    [
        (b'"speedup":1.5', b'"speedup":-15'),  # not a speed-up
        (b'"graph":"' + b"c" * 64, b'"graph":"' + b"z" * 64),  # not a sha256
        (b'"kind":"openvino"', b'"kind":70000000.0'),  # a backend without a kind
        (b'"depth":1,"speedup"', b'"depth":2,"speedup"'),  # another depth than the record's
    ],
)
def test_a_malformed_plan_is_refused_with_a_typed_error(good: bytes, bad: bytes) -> None:
    data = encode_calls([Sample((torch.zeros(2, 2),), {})], KEY, depth=1, plan=PLAN)
    assert good in data and len(good) == len(bad)
    with pytest.raises(MalformedCallsError):
        decode_record(data.replace(good, bad), KEY)


@pytest.mark.parametrize("depth", [b"-1", b"true", b'"1"', b"1.5", b"65"])
def test_a_record_naming_no_real_depth_is_refused(depth: bytes) -> None:
    good = encode_calls([Sample((torch.zeros(2, 2),), {})], KEY, depth=1)
    bad = good.replace(b'"depth":1', b'"depth":' + depth)
    bad = struct.pack("<Q", struct.unpack("<Q", bad[:8])[0] + len(depth) - 1) + bad[8:]
    with pytest.raises(MalformedCallsError, match="depth"):
        decode_record(bad, KEY)


def test_stored_calls_are_checked_and_signed_when_a_key_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CallsStore(tmp_path, None, 1 << 20)
    body = encode_calls([Sample((torch.ones(2, 2),), {})], KEY)
    store.put(KEY, body)
    found = store.get(KEY, torch.device("cpu"))
    assert found is not None and found[1] == "local"
    path = tmp_path / "jit" / KEY
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    assert store.get(KEY, torch.device("cpu")) is None
    path.write_bytes(data)
    monkeypatch.setenv(KEY_ENV, "fleet-secret")  # an unsigned record is refused now
    assert store.get(KEY, torch.device("cpu")) is None
    store.put(KEY, body)
    assert store.get(KEY, torch.device("cpu")) is not None
