"""Cooperative interruption of long computations: the core's long loops call `check()`, and
whoever runs the core may supply what `check()` does (`checking(hook)`).

Inside PostgreSQL, PL/Python runs pure Python and numpy without looking at the server's pending
interrupts (pg_cancel_backend, statement_timeout, pg_terminate_backend): only a call into the
server does. The SQL functions (frontends/sql/bodies.py) therefore supply a hook that makes a
cheap server round trip, where the server raises the pending interrupt. `check()` calls the hook
at most once per INTERVAL seconds (a monotonic clock read otherwise), so a loop may call it
every iteration. The core defines the hook's place and never imports a front end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

INTERVAL = 0.05  # seconds between two hook calls: an interrupt is answered within about this

_hook: ContextVar[tuple[Callable[[], None], list[float]] | None] = ContextVar(
    "topk_interrupt_hook", default=None
)


def check() -> None:
    """Give the hook of `checking` a chance to raise (at most once per INTERVAL)."""
    current = _hook.get()
    if current is None:
        return
    hook, last = current
    now = time.monotonic()
    if now - last[0] >= INTERVAL:
        last[0] = now
        hook()


@contextmanager
def checking(hook: Callable[[], None]) -> Iterator[None]:
    """Within the block, `check()` calls `hook` (which raises to interrupt the computation)."""
    token = _hook.set((hook, [time.monotonic()]))
    try:
        yield
    finally:
        _hook.reset(token)
