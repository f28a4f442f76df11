"""A small S3 client for the remote tier: bounded reads, conditional puts, typed failures.

It wraps boto3 (imported on first use; ``pip install 'tunetree[remote]'``), which reads the
endpoint and credentials the standard way (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE`` and the shared config files). Every request has
bounded connect and read timeouts and few retries, and a wall-clock limit from its request to
its answer's last byte (a server that drips its headers or body, each byte within the read
timeout, is cut off at it), so a remote that hangs costs seconds, not the tuning. Failures
come back as three kinds: :class:`RemoteUnavailable` (cannot be reached, timed out, cut
off), :class:`RemoteRefused` (it answered no: access denied, full, a server error) and
:class:`RemoteMissing` (no such object); a conditional put that loses answers False.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .._util.interrupt import raised_after
from ..errors import CacheError, MissingDependencyError

CHUNK = 1 << 20
"""Bytes read from a response body at a time."""

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


class RemoteError(CacheError):
    """The remote tier could not do what was asked (the local cache goes on)."""


class RemoteUnavailable(RemoteError):
    """The remote cannot be reached, or did not answer in time."""


class RemoteRefused(RemoteError):
    """The remote answered with a refusal: access denied, full, a server error."""


class RemoteMissing(RemoteError):
    """No object under that name."""


@dataclass(frozen=True)
class S3Location:
    """``s3://BUCKET/PREFIX``: a bucket and the prefix every object name starts with."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """Read ``s3://bucket/some/prefix``; CacheError naming what is wrong otherwise."""
        match = re.fullmatch(r"s3://([^/]+)(?:/(.*))?", url.strip())
        if not match:
            raise CacheError(f"a remote cache is an s3://BUCKET/PREFIX URL, not {url!r}")
        bucket, prefix = match.group(1), (match.group(2) or "").strip("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise CacheError(
                f"{bucket!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.', '-')"
            )
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise CacheError(f"the prefix {prefix!r} of {url!r} has an empty, '.' or '..' part")
        return cls(bucket, prefix)

    def name(self, *parts: str) -> str:
        """The object name of ``parts`` under the prefix."""
        return "/".join(p for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class Timeouts:
    """How long the remote may take: per connection, per read, per object, and attempts."""

    connect_s: float = 2.0
    read_s: float = 5.0
    transfer_s: float = 120.0
    """Wall-clock limit of one object's download or upload, from its request to its last byte:
    every read waits at most the time left, so a server trickling bytes is cut off at it."""
    attempts: int = 2
    request_s: float = 30.0
    """Wall-clock limit of a request that moves no object (head, delete, a page of a listing),
    its retries included: an answer dripped byte by byte is cut off at it."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its name below the prefix, size and last modification (epoch s)."""

    name: str
    size: int
    modified: float


def _boto3() -> Any:
    try:
        import boto3
        import botocore
    except ImportError as exc:
        raise MissingDependencyError(
            "the remote tuning cache needs boto3: pip install 'tunetree[remote]'"
        ) from exc
    return boto3, botocore


class S3Client:
    """Objects under one :class:`S3Location`, through a boto3 client made on first use."""

    def __init__(
        self,
        location: S3Location,
        timeouts: Timeouts | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        self.location = location
        self.timeouts = timeouts or Timeouts()
        self.endpoint_url = endpoint_url
        self._client: Any = None
        self._botocore: Any = None
        _boto3()  # fail now, with the install hint, when boto3 is absent

    def _s3(self) -> Any:
        if self._client is None:
            boto3, botocore = _boto3()
            from botocore.config import Config

            config = Config(
                connect_timeout=self.timeouts.connect_s,
                read_timeout=self.timeouts.read_s,
                retries={"total_max_attempts": self.timeouts.attempts, "mode": "standard"},
                # S3-compatible servers (an endpoint other than AWS's) are addressed by path:
                # bucket names as host names need DNS set up for them.
                s3={"addressing_style": "path"} if _custom_endpoint(self.endpoint_url) else None,
                # tunetree checks every byte by sha256 itself; S3-compatible servers differ in
                # the optional checksums boto3 >= 1.36 sends by default, so send them only
                # where an operation requires them.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            session = boto3.session.Session()
            self._client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
            self._botocore = botocore
        return self._client

    # ------------------------------------------------------------------ requests

    def get(self, name: str, max_bytes: int) -> tuple[bytes, str]:
        """The object's bytes (at most ``max_bytes``, else RemoteRefused) and its ETag.

        RemoteUnavailable when it takes longer than the transfer limit.
        """
        deadline = time.monotonic() + self.timeouts.transfer_s
        response = self._call("get_object", name, deadline)
        declared = int(response.get("ContentLength") or 0)
        if declared > max_bytes:
            response["Body"].close()
            raise RemoteRefused(f"{name} holds {declared} bytes, more than {max_bytes}")
        data = bytearray()
        self._stream(response["Body"], name, max_bytes, data.extend, deadline)
        return bytes(data), str(response.get("ETag", ""))

    def download(self, name: str, target: Path, size: int) -> str:
        """Write the object to ``target``; it must hold exactly ``size`` bytes.

        Returns the sha256 of what was written; RemoteRefused for another size,
        RemoteUnavailable when it takes longer than the transfer limit.
        """
        deadline = time.monotonic() + self.timeouts.transfer_s
        response = self._call("get_object", name, deadline)
        declared = int(response.get("ContentLength") or 0)
        if declared != size:
            response["Body"].close()
            raise RemoteRefused(f"{name} holds {declared} bytes, not the {size} recorded")
        sha = hashlib.sha256()
        with open(target, "wb") as f:

            def write(chunk: bytes) -> None:
                sha.update(chunk)
                f.write(chunk)

            got = self._stream(response["Body"], name, size, write, deadline)
        if got != size:
            raise RemoteRefused(f"{name} ended after {got} of {size} bytes")
        return sha.hexdigest()

    def head(self, name: str) -> tuple[int, str] | None:
        """Size and ETag of the object, or None when there is none."""
        try:
            response = self._call("head_object", name, self._request_deadline())
        except RemoteMissing:
            return None
        return int(response.get("ContentLength") or 0), str(response.get("ETag", ""))

    def put(
        self, name: str, body: bytes | BinaryIO, *, if_none_match: bool = False, if_match: str = ""
    ) -> bool:
        """Store an object; False when its condition failed (412: created or changed meanwhile).

        ``if_none_match``: only when no object has that name (``If-None-Match: *``);
        ``if_match``: only while the object still has this ETag.
        """
        extra: dict[str, Any] = {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        if if_match:
            extra["IfMatch"] = if_match
        try:
            deadline = time.monotonic() + self.timeouts.transfer_s
            self._call("put_object", name, deadline, Body=body, **extra)
        except _ConditionFailed:
            return False
        return True

    def put_file(self, name: str, path: Path, *, if_none_match: bool = False) -> bool:
        """:meth:`put` of a local file's bytes."""
        with open(path, "rb") as f:
            return self.put(name, f, if_none_match=if_none_match)

    def delete(self, name: str) -> None:
        """Remove the object (no error when it is already gone)."""
        with contextlib.suppress(RemoteMissing):
            self._call("delete_object", name, self._request_deadline())

    def list(self, folder: str, limit: int = 1_000_000) -> Iterator[ObjectInfo]:
        """Objects whose names start with ``folder/`` under the prefix, at most ``limit``."""
        start = self.location.name(folder) + "/"
        token: str | None = None
        seen = 0
        while True:
            args: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": start}
            if token:
                args["ContinuationToken"] = token
            page = self._request("list_objects_v2", args, start, self._request_deadline())
            for item in page.get("Contents", []):
                seen += 1
                if seen > limit:
                    return
                modified = item.get("LastModified")
                yield ObjectInfo(
                    str(item["Key"])[len(start) :],
                    int(item.get("Size") or 0),
                    modified.timestamp() if modified is not None else 0.0,
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # ------------------------------------------------------------------ plumbing

    def _request_deadline(self) -> float:
        return time.monotonic() + self.timeouts.request_s

    def _call(self, operation: str, name: str, deadline: float, **extra: Any) -> Any:
        args = {"Bucket": self.location.bucket, "Key": self.location.name(name), **extra}
        return self._request(operation, args, name, deadline)

    def _request(self, operation: str, args: dict[str, Any], name: str, deadline: float) -> Any:
        """One request and its answer's headers, by ``deadline`` (monotonic) at the latest.

        The read timeout bounds each read only: a request past ``deadline`` is interrupted
        (:func:`tunetree._util.interrupt.raised_after`, within a read timeout at worst), and its
        client, whose connection it left mid-answer, is dropped.
        """
        client = self._s3()
        exceptions = self._botocore.exceptions
        limit = max(deadline - time.monotonic(), 0.0)
        try:
            with raised_after(limit, _PastDeadline):
                return getattr(client, operation)(**args)
        except _PastDeadline:
            self._client = None
            raise RemoteUnavailable(
                f"{operation} {name}: no answer by its deadline ({limit:.0f} s); cut off"
            ) from None
        except exceptions.ClientError as exc:
            raise _client_error(exc, operation, name) from exc
        except (exceptions.BotoCoreError, OSError) as exc:
            raise RemoteUnavailable(f"{operation} {name}: {type(exc).__name__}: {exc}") from exc

    def _stream(self, body: Any, name: str, limit: int, sink: Any, deadline: float) -> int:
        """Copy ``body`` to ``sink`` within ``limit`` bytes and by ``deadline`` (monotonic).

        Each read returns what has arrived (at most :data:`CHUNK`) and the socket's timeout is
        the time left, so a server that trickles bytes, each within the read timeout, is cut
        off at the deadline, not after its whole answer.
        """
        raw = getattr(body, "_raw_stream", None)
        read = getattr(raw, "read1", None) or body.read
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        errors = (self._botocore.exceptions.BotoCoreError, OSError, *_urllib3_errors())
        got = 0
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteUnavailable(
                        f"{name}: transfer slower than {self.timeouts.transfer_s:.0f} s; cut off"
                    )
                if sock is not None:
                    sock.settimeout(min(self.timeouts.read_s, left))
                try:
                    chunk = read(CHUNK)
                except errors as exc:
                    if time.monotonic() >= deadline:
                        raise RemoteUnavailable(
                            f"{name}: transfer slower than {self.timeouts.transfer_s:.0f} s; "
                            "cut off"
                        ) from exc
                    raise RemoteUnavailable(f"reading {name}: {type(exc).__name__}: {exc}") from exc
                if not chunk:
                    return got
                got += len(chunk)
                if got > limit:
                    raise RemoteRefused(f"{name} is larger than {limit} bytes")
                sink(chunk)
        finally:
            with contextlib.suppress(*errors):
                body.close()


def _urllib3_errors() -> tuple[type[Exception], ...]:
    """urllib3's own failures (a read timeout raised by a raw read is not an OSError)."""
    try:
        from urllib3.exceptions import HTTPError
    except ImportError:
        return ()
    return (HTTPError,)


def _custom_endpoint(explicit: str | None) -> bool:
    """Whether an endpoint other than AWS's is configured (argument or standard variables)."""
    return bool(
        explicit or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )


class _PastDeadline(BaseException):
    """Raised inside a request past its deadline; never leaves :meth:`S3Client._request`."""


class _ConditionFailed(RemoteError):
    """A conditional request's precondition did not hold (HTTP 412)."""


def _client_error(exc: Any, operation: str, name: str) -> RemoteError:
    """The typed failure for a botocore ClientError (an answer from the server)."""
    error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in ("PreconditionFailed", "412") or status == 412:
        return _ConditionFailed(f"{operation} {name}: precondition failed")
    if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
        return RemoteMissing(f"no object {name}")
    message = str(error.get("Message", "")) or str(exc)
    return RemoteRefused(f"{operation} {name}: {code or status}: {message}")
