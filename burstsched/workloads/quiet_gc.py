"""Keep the load generator's garbage collector from pausing it in the middle of a timed run.

A workload builds its whole request sequence before the run (prompts, chat messages, token counts): a
few hundred thousand long-lived objects. CPython's full collection walks every tracked object, and the
allocation a burst of sends sets off is what triggers one, so the pause lands on a burst. Measured on
the multi-tenant chat (simulated pool, 290 requests): a 98 ms full collection in the middle of the
60-second run, during which the client neither sent nor read a stream. Every request in flight then
looks 98 ms slower, whichever router it went through.

:func:`quiet_gc` collects once and freezes what is alive (``gc.freeze``: those objects are never walked
again) for the length of the run, so a collection during it only walks what the run itself allocated;
on exit every frozen object (also any frozen before, so not for a process that freezes its own) is
handed back to the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect, then freeze every live object until the block ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
