"""A block interrupted past its time, and nothing else: no exception after it, no watcher left."""

from __future__ import annotations

import threading
import time

import pytest

from tunetree._util.interrupt import raised_after


class Late(BaseException):
    pass


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tunetree-interrupt"]


def test_a_block_past_its_time_is_interrupted_and_one_in_time_is_not() -> None:
    start = time.monotonic()
    with pytest.raises(Late), raised_after(0.2, Late) as interrupt:
        while True:
            time.sleep(0.01)
    assert interrupt.fired and time.monotonic() - start < 5
    with raised_after(5.0, Late) as interrupt:
        time.sleep(0.01)
    assert not interrupt.fired
    time.sleep(0.1)  # a stray exception would be raised here
    assert not _watchers()


def test_an_interrupt_swallowed_once_is_raised_again() -> None:
    """As in a finalizer, where Python prints the exception and goes on."""
    swallowed = 0
    with pytest.raises(Late), raised_after(0.1, Late, refire_s=0.1):
        while True:
            try:
                time.sleep(0.01)
            except Late:
                swallowed += 1
                if swallowed > 1:
                    raise
    assert swallowed == 2 and not _watchers()
