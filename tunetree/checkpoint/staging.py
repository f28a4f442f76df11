"""Putting a written checkpoint at its path atomically, and recovering from killed saves.

A save fills a staging file or directory beside the target (``<name>.tmp-<host>-<pid>-<hex>``)
and then puts it in place:

* a file over a file: one ``rename``, atomic;
* anything involving a directory: on Linux one ``renameat2(RENAME_EXCHANGE)`` swaps the two
  atomically, so the path always holds the old or the new checkpoint; where that call is
  missing, the old target is renamed aside (``<name>.old-<host>-<pid>-<hex>``), the new one
  renamed in, and the old one deleted.

A save killed between those two renames leaves no checkpoint at its path, and every killed
save leaves its staging files. :func:`recover` puts such an ``.old`` copy back when the
target is missing, and removes the staging and ``.old`` leftovers of writers that are gone
(a process of this host that no longer runs, or anything older than an hour); ``save`` and
``load`` run it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path

from .._util.fs import fsync_dir

HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:64] or "host"
"""This machine's name as sibling names hold it (a pid means nothing on another host)."""
ABANDONED_S = 3600.0
"""A sibling this old is abandoned whoever wrote it (another host's writer included)."""
STALE_ASIDE_S = 60.0
"""An ``.old`` copy beside a missing target this old was left by a killed save: the window
between its two renames is microseconds."""

_SIBLING = re.compile(r"\.(tmp|old)-(?:(?P<host>[A-Za-z0-9_]+)-)?(?P<pid>[0-9]+)-[0-9a-f]{8}")


def sibling(target: Path, tag: str = "tmp") -> Path:
    """A fresh name beside ``target`` for a save's staging (``tmp``) or old copy (``old``)."""
    return target.with_name(f"{target.name}.{tag}-{HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def install(tmp: Path, target: Path) -> None:
    """Put the fully written (and fsynced) ``tmp`` at ``target``; see the module docstring."""
    if target.exists() and (tmp.is_dir() or target.is_dir()):
        if exchange(tmp, target):
            fsync_dir(target.parent)
            _remove(tmp)  # now the old checkpoint
        else:
            aside = sibling(target, "old")
            os.rename(target, aside)
            os.rename(tmp, target)
            fsync_dir(target.parent)
            _remove(aside)
    else:
        os.replace(tmp, target)
    fsync_dir(target.parent)


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM):
        return False  # the filesystem or kernel cannot: rename aside instead
    raise OSError(err, os.strerror(err), str(b))


def recover(target: Path) -> None:
    """Put back a killed save's old copy when ``target`` is missing; remove dead leftovers.

    Never raises for what it cannot change (a read-only directory): a load then reads what
    is there, as before.
    """
    with contextlib.suppress(OSError):
        _recover(target)


def _recover(target: Path) -> None:
    mine = [(p, m) for p in target.parent.iterdir() if (m := _sibling_match(target, p))]
    if not os.path.lexists(target):
        asides = [(p, m) for p, m in mine if m.group(1) == "old" and _put_back_ok(p, m)]
        if asides:
            newest = max(asides, key=lambda item: item[0].lstat().st_mtime)[0]
            os.rename(newest, target)
            fsync_dir(target.parent)
    for path, match in mine:
        if path.exists() and _gone(path, match):
            _remove(path)


def _sibling_match(target: Path, path: Path) -> re.Match[str] | None:
    if not path.name.startswith(target.name + "."):
        return None
    return _SIBLING.fullmatch(path.name[len(target.name) :])


def _age_s(path: Path) -> float:
    return time.time() - path.lstat().st_mtime


def _gone(path: Path, match: re.Match[str]) -> bool:
    """Whether the writer of ``path`` no longer runs (or the sibling is abandoned)."""
    host, pid = match.group("host"), int(match.group("pid"))
    if host == HOST and pid != os.getpid():
        return not _alive(pid)
    return _age_s(path) > ABANDONED_S


def _put_back_ok(path: Path, match: re.Match[str]) -> bool:
    return _gone(path, match) or _age_s(path) > STALE_ASIDE_S


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
