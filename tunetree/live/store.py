"""The JIT's recorded calls in the tuning cache, locally and on its remote tier.

**Key** (:func:`calls_key`): the structure digest of each of the model's roots (code,
attributes, parameter shapes), the ``call`` function and the device type: a second process
serving the same model finds the calls the first one tuned on. The weights are not in the
key; a plan is checked against eager on this process's model before it serves anyway.

**Record**: the bytes of :mod:`.calls` in the sealed envelope of
:mod:`tunetree.cache.sealing` under its own first line (``tunetree-jit-calls 1``), with a
sha256 line over the body: signed with ``$TUNETREE_CACHE_KEY`` when it is set (then an unsigned
or wrongly signed record is refused). Locally ``jit/<key>``; remotely ``v1/jit/<key>``. Every
byte read is hostile until checked (size bound, regular file, checksum, signature, the key in
the envelope, then :func:`~.calls.decode_record`, which also refuses a record whose body names
another key). Neither read nor write ever raises: a refused or missing record means the JIT
records and tunes afresh.

The record holds real traffic (the calls' tensors): it is written only where the tuning
cache is, and ``tt.jit(..., share_calls=False)`` keeps it out.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from .._util.fs import is_real_dir, read_regular, write_atomically
from ..cache import keys
from ..cache.entry import EntryFault
from ..cache.remote import LAYOUT, RemoteTier, get_object, is_key, put_object
from ..cache.sealing import seal, secret_from_env, unseal
from ..search.recorded import RecordedPlan
from ..signature.graph import Sample
from ..signature.modules import CallFn, root_modules
from .calls import MalformedCallsError, decode_record

log = logging.getLogger(__name__)

MAGIC = b"tunetree-jit-calls 1"
DIRECTORY = "jit"
OVERHEAD_BYTES = 8 << 20
"""Bytes a record may hold beyond the recorder's tensor bound (description, headers)."""


def calls_key(model: Any, call: CallFn | None, device: torch.device) -> str:
    """The key of the calls recorded for ``model`` served through ``call`` on ``device``."""
    roots = [[p, keys.structure_digest(m)] for p, m in sorted(root_modules(model).items())]
    record = {
        "schema": 1,
        "kind": "tt.jit recorded calls",
        "roots": roots,
        "call": keys.stable(call),
        "device_type": device.type,
    }
    return keys.digest(record)[:40]


class CallsStore:
    """Recorded calls under ``root/jit`` and on ``remote`` (if any); see the module docstring."""

    def __init__(self, root: Path, remote: RemoteTier | None, max_bytes: int) -> None:
        self.directory = Path(root) / DIRECTORY
        self.remote = remote
        self.limit = max_bytes + OVERHEAD_BYTES

    def _secret(self) -> bytes | None:
        return self.remote.secret if self.remote is not None else secret_from_env()

    def get(
        self, key: str, device: torch.device
    ) -> tuple[list[Sample], str, int | None, RecordedPlan | None] | None:
        """The checked calls of ``key``, where they came from, the depth and plan kept on them.

        None when there is no usable record. Where: ``"local"`` or ``"remote"``. The depth
        and the plan are None when the record holds none.
        """
        if not is_key(key):
            return None
        data = self._read_local(key)
        where = "local"
        if data is None:
            data, where = self._pull(key), "remote"
        if data is None:
            return None
        try:
            body = self._open(data, key)
            samples, depth, plan = decode_record(body, key, device)
        except (EntryFault, MalformedCallsError) as exc:
            log.warning("tt.jit: %s recorded calls %s not used: %s", where, key[:12], exc)
            return None
        if where == "remote":
            self._write_local(key, data)
        log.debug(
            "tt.jit: %s recorded calls %s: %d calls, depth %s, %s",
            where,
            key[:12],
            len(samples),
            depth,
            f"a plan of {len(plan.graphs)} graphs" if plan is not None else "no plan",
        )
        return samples, where, depth, plan

    def put(self, key: str, body: bytes) -> None:
        """Record ``body`` (encoded calls) here and on the remote tier; logs instead of raising."""
        if not is_key(key) or len(body) > self.limit:
            return
        raw = hashlib.sha256(body).hexdigest().encode() + b"\n" + body
        data = seal(key, raw, self._secret(), MAGIC)
        self._write_local(key, data)
        self._push(key, data)

    def _open(self, data: bytes, key: str) -> bytes:
        raw, _ = unseal(data, key, self._secret(), MAGIC)
        head, sep, body = raw.partition(b"\n")
        if not sep or hashlib.sha256(body).hexdigest().encode() != head:
            raise EntryFault("the record is truncated or corrupted (checksum)")
        return body

    def _read_local(self, key: str) -> bytes | None:
        try:
            if not is_real_dir(self.directory):
                return None
            return read_regular(self.directory / key, self.limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("tt.jit: local recorded calls %s not used: %s", key[:12], exc)
            return None

    def _write_local(self, key: str, data: bytes) -> None:
        try:
            write_atomically(self.directory, key, data)
        except OSError as exc:
            log.warning("tt.jit: could not record calls %s: %s", key[:12], exc)

    def _pull(self, key: str) -> bytes | None:
        if self.remote is None:
            return None
        return get_object(self.remote, remote_name(key), self.limit)

    def _push(self, key: str, data: bytes) -> None:
        if self.remote is not None:
            put_object(self.remote, remote_name(key), data)


def remote_name(key: str) -> str:
    """The object name of ``key``'s recorded calls below the remote's prefix."""
    return f"{LAYOUT}/{DIRECTORY}/{key}"
