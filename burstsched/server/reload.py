"""What sets off a live config reload in ``burstsched serve``: SIGHUP, and (``--reload-poll S``) a change of
the config file's content. The reload itself is :mod:`burstsched.front.live_config` (also
``POST /admin/reload``).

The config is read again exactly as at start: the same file, the same loader and plugin build, and the command
line's ``--endpoint``, ``--kv-events``, ``--kv-events-replay`` and ``--tokenizer`` applied again on top.

The file watch compares the file's SHA-256 every ``S`` seconds (its mtime alone misses an edit within the
same second and sees a ``touch`` as a change); it is off by default, because an editor saving a file halfway
would be read as an invalid config and logged as refused (harmless: the old config stays, and the next poll
reads the finished file). Deployments that swap the file atomically (a Kubernetes ConfigMap) can turn it on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from starlette.applications import Starlette

from burstsched.config import (
    RouterConfig,
    attach_kv_events,
    load_config,
    parse_endpoint_arg,
    with_tokenizer,
)
from burstsched.front.live_config import ConfigSource, LiveConfig, ReloadOutcome

log = logging.getLogger(__name__)


def config_source(
    path: Path,
    *,
    endpoints: Sequence[str] = (),
    kv_events: Sequence[str] = (),
    kv_events_replay: Sequence[str] = (),
    tokenizer: str | None = None,
) -> ConfigSource:
    """How ``serve`` reads its config: the file, then the command line's overrides (raises ConfigError)."""

    def load() -> RouterConfig:
        config = load_config(path, endpoints=[parse_endpoint_arg(text) for text in endpoints])
        config = attach_kv_events(config, kv_events, kv_events_replay)
        if tokenizer is not None:
            config = with_tokenizer(config, tokenizer)
        return config

    return load


def file_digest(path: Path) -> str | None:
    """The SHA-256 of the file's bytes; None when it cannot be read (e.g. being replaced)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class ReloadTriggers:
    """Installed once the server is serving: SIGHUP (and the file watch) reload the app's config.

    ``poll_s``: seconds between looks at ``path`` (None: no file watch)."""

    app: Starlette
    path: Path
    poll_s: float | None = None
    on_outcome: Callable[[ReloadOutcome], None] | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _digest: str | None = None
    _pending: bool = False

    def hold(self) -> None:
        """Until :meth:`start`: a SIGHUP (whose default action ends the process) is noted, and acted on once
        serving (the config being read as it came may be the old one)."""
        self._digest = file_digest(self.path)
        signal.signal(signal.SIGHUP, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending = True

    def start(self) -> None:
        """On the server's event loop: handle SIGHUP, start the file watch."""
        loop = asyncio.get_running_loop()
        if self._digest is None:
            self._digest = file_digest(self.path)
        try:
            loop.add_signal_handler(signal.SIGHUP, self._spawn, "SIGHUP")
        except (ValueError, RuntimeError, NotImplementedError) as exc:  # not the main thread
            log.warning("SIGHUP will not reload the config: %s", exc)
        if self._pending:
            self._pending = False
            self._spawn("SIGHUP while starting")
        if self.poll_s is not None:
            self._keep(loop.create_task(self._watch(self.poll_s), name="burstsched-config-watch"))

    def _spawn(self, trigger: str) -> None:
        self._keep(asyncio.get_running_loop().create_task(self._reload(trigger)))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload(self, trigger: str) -> None:
        live = getattr(self.app.state, "live_config", None)
        if not isinstance(live, LiveConfig):
            log.warning("config reload (%s) before the router started: ignored", trigger)
            return
        self._digest = file_digest(self.path)
        outcome = await live.reload(trigger)
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    async def _watch(self, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            digest = await asyncio.to_thread(file_digest, self.path)
            if digest is not None and digest != self._digest:
                await self._reload("file changed")
