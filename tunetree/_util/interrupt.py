"""Interrupt a block of this thread that outlives its time: a build, a remote request.

A watcher thread sets the exception asynchronously (``PyThreadState_SetAsyncExc``): it is raised
at this thread's next Python instruction, so a block inside a long C call (a compiler
subprocess, a socket read) stops when that call returns. Raised inside a finalizer or a weakref
callback, the exception is printed and ignored by Python ("Exception ignored in") and the block
goes on, so it is set again every ``refire_s`` until the block ends. An exception set as the
block ended is withdrawn before it can be raised outside it, and the watcher is joined.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass

REFIRE_S = 0.5
"""How often the exception is raised again while the interrupted block still runs."""


@dataclass
class Interrupt:
    """What :func:`raised_after` did.

    ``fired`` once the time was up (the block was interrupted unless it ended at that moment).
    """

    fired: bool = False


@contextlib.contextmanager
def raised_after(
    seconds: float, exc_type: type[BaseException], refire_s: float = REFIRE_S
) -> Iterator[Interrupt]:
    """Raise ``exc_type`` in this thread if the block runs longer than ``seconds``.

    Args:
        seconds: The block's time (0 or less: interrupted at once).
        exc_type: What to raise; a ``BaseException`` that is not an ``Exception`` passes every
            library's ``except Exception`` (a library must not take it for its own failure).
        refire_s: How often it is raised again while the block still runs.

    Yields:
        The :class:`Interrupt`; its ``fired`` says whether the time ran out.
    """
    target = threading.get_ident()
    lock = threading.Lock()
    interrupt = Interrupt()
    finished = threading.Event()

    def watch() -> None:
        timeout = max(seconds, 0.0)
        while not finished.wait(timeout):
            with lock:
                if finished.is_set():
                    return
                interrupt.fired = True
                _set_async_exc(target, exc_type)
            timeout = refire_s

    watcher = threading.Thread(target=watch, name="tunetree-interrupt", daemon=True)
    watcher.start()
    try:
        yield interrupt
    finally:
        _finish(lock, finished, interrupt, target, exc_type)
        watcher.join()


def _finish(
    lock: threading.Lock,
    finished: threading.Event,
    interrupt: Interrupt,
    target: int,
    exc_type: type[BaseException],
) -> None:
    """Stop the watcher and withdraw a pending exception; one raised meanwhile is retried past."""
    while True:
        try:
            with lock:
                finished.set()
                if interrupt.fired:
                    _set_async_exc(target, None)  # withdraw it if it was not raised yet
            return
        except exc_type:  # set just before the lock was taken: finish again
            continue


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )
