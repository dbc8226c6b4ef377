"""Live config: a new configuration swapped into the running router between requests.

What a reload changes at once:

* the scheduling profile (``plugins``, ``profile``: weights, filters, scorers, picker, plugin parameters).
  A plugin whose name, type and parameters are unchanged stays the same instance, with what it learned
  (the approximate prefix index stays warm); the others are built anew;
* the admission settings (``admission``: window, batch, limits, bypass);
* the endpoint list (``endpoints``, through the pool, when discovery is static: new ones join once checked,
  missing ones drain);
* ``limits.request_timeout_ms`` and ``limits.max_body_bytes`` (read per request).

Everything else (the listen address, auth, tracing, dispatch, pool timings, the other limits, prefix hashing,
the tokenizer, KV events, recording, discovery, models) was fixed when the router started: a reload that
changes it applies the rest and names those fields in ``restart_required`` (and a warning in the log).
A reload is refused, the old config kept, when the new one is invalid (its issues name the fields) or when it
would add, remove or rebuild a KV-event consumer (the precise prefix producer: its event streams were wired at
start).

The swap is synchronous, on the event loop: a request already admitted finishes with the decision it holds;
the next one is scheduled and admitted under the new config.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from burstsched.admission import Admission
from burstsched.config import ConfigError, ConfigIssue, RouterConfig
from burstsched.framework import KVEventConsumer, Plugin, PluginContext, PluginRegistry
from burstsched.kvcache import KVEventHub, stream_addresses
from burstsched.pool import EndpointPool
from burstsched.scheduling import PreviousPlugins, Scheduler, build_scheduler
from burstsched.telemetry.metrics import RouterMetrics

log = logging.getLogger(__name__)

Outcome = Literal["applied", "unchanged", "refused"]

ConfigSource = Callable[[], RouterConfig]
"""Reads the configuration again, as the router was started with it (file and command-line overrides);
raises :class:`ConfigError` when it is invalid."""

LIVE_LIMITS = ("request_timeout_ms", "max_body_bytes")
"""The ``limits`` read per request (the others were handed to uvicorn or the middleware at start)."""


@dataclass(frozen=True)
class ReloadOutcome:
    """What a reload did: ``applied``, ``unchanged`` (nothing live differs) or ``refused`` (``issues``)."""

    outcome: Outcome
    issues: tuple[ConfigIssue, ...] = ()
    restart_required: tuple[str, ...] = ()
    """Fields that differ from the running config but take effect only at restart."""
    reused_plugins: tuple[str, ...] = ()
    rebuilt_plugins: tuple[str, ...] = ()
    endpoints_added: tuple[str, ...] = ()
    endpoints_removed: tuple[str, ...] = ()
    sha256: str = ""
    """Of the running config (after an applied reload, the new one)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "issues": [{"field": i.path, "message": i.message} for i in self.issues],
            "restart_required": list(self.restart_required),
            "reused_plugins": list(self.reused_plugins),
            "rebuilt_plugins": list(self.rebuilt_plugins),
            "endpoints_added": list(self.endpoints_added),
            "endpoints_removed": list(self.endpoints_removed),
            "sha256": self.sha256,
        }


def config_digest(config: RouterConfig) -> str:
    """A stable digest of a configuration's content."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


@dataclass
class LiveConfig:
    """The running router's swappable parts and how to read its config again; one reload at a time."""

    config: RouterConfig
    source: ConfigSource | None
    registry: PluginRegistry
    context: PluginContext
    scheduler: Scheduler
    admission: Admission
    pool: EndpointPool
    metrics: RouterMetrics
    hub: KVEventHub | None
    discovery_source: str
    on_config: Callable[[RouterConfig], None]
    """Called with the new running config once swapped in (the app's :class:`Router` reads limits from it)."""
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    async def reload(self, trigger: str = "admin") -> ReloadOutcome:
        """Read the config again and swap it in (or refuse it); ``trigger`` is for the log."""
        async with self._lock:
            if self.source is None:
                issue = ConfigIssue("", "this router was not started from a config file: nothing to reload")
                return self._refused((issue,))
            try:
                new = await anyio.to_thread.run_sync(self.source)
            except ConfigError as exc:
                return self._refused(tuple(exc.issues))
            outcome = self.apply(new)
            log.info("config reload (%s): %s", trigger, outcome.outcome)
            return outcome

    def apply(self, new: RouterConfig) -> ReloadOutcome:
        """Swap ``new`` in, or refuse it (the old config stays); synchronous: no request runs meanwhile."""
        old = self.config
        static = self.discovery_source == "static"
        live: dict[str, Any] = {
            "plugins": new.plugins,
            "profile": new.profile,
            "admission": new.admission,
            "saturation": new.saturation,
            "limits": old.limits.model_copy(update={k: getattr(new.limits, k) for k in LIVE_LIMITS}),
        }
        if static:
            live["endpoints"] = new.endpoints
        effective = old.model_copy(update=live)
        restart = _differences(effective, new)
        if static and not new.endpoints and new.pool.selector is None:
            return self._refused((ConfigIssue("endpoints", "no endpoints: the router would serve nothing"),))
        previous = PreviousPlugins(old.plugins, {p.name: p for p in self.scheduler.profile.plugins})
        try:
            built = build_scheduler(new, self.registry, self.context, previous=previous)
        except ConfigError as exc:
            return self._refused(tuple(exc.issues))
        issues = _consumer_changes(self.scheduler.profile.plugins, built.profile.plugins, new)
        if issues:
            return self._refused(issues)
        added, removed = _endpoint_changes(old, effective) if static else ((), ())
        if effective == old:
            self._warn_restart(restart)
            self.metrics.config_reload("unchanged")
            return ReloadOutcome("unchanged", restart_required=restart, sha256=config_digest(old))
        # the swap: every statement below is synchronous, so no request sees half of it
        self.scheduler.profile = built.profile
        self.admission.reconfigure(new.admission)
        if static:
            self.pool.sync(effective.endpoints, source="static")
            if self.hub is not None:
                for address in stream_addresses(effective.endpoints, old.kv_events):
                    self.hub.add_endpoint(address)
        self.metrics.watch_plugins(built.profile.plugins, lambda: self.pool.names)
        self.config = effective
        self.on_config(effective)
        self._warn_restart(restart)
        self.metrics.config_reload("applied")
        reused = tuple(previous.reused)
        rebuilt = tuple(s.instance_name for s in new.plugins if s.instance_name not in previous.reused)
        log.warning(
            "config reloaded: plugins re-used %s, rebuilt %s; endpoints added %s, removed %s",
            list(reused),
            list(rebuilt),
            list(added),
            list(removed),
        )
        return ReloadOutcome(
            "applied",
            restart_required=restart,
            reused_plugins=reused,
            rebuilt_plugins=rebuilt,
            endpoints_added=added,
            endpoints_removed=removed,
            sha256=config_digest(effective),
        )

    def _refused(self, issues: tuple[ConfigIssue, ...]) -> ReloadOutcome:
        self.metrics.config_reload("refused")
        log.error(
            "config reload refused, the running config stays: %s",
            "; ".join(f"{i.path or '(config)'}: {i.message}" for i in issues),
        )
        return ReloadOutcome("refused", issues=issues, sha256=config_digest(self.config))

    def _warn_restart(self, fields: tuple[str, ...]) -> None:
        if fields:
            log.warning("config reload: %s changed, which takes effect only at restart", ", ".join(fields))


def _differences(running: RouterConfig, new: RouterConfig) -> tuple[str, ...]:
    """The fields (``section`` or ``section.field``) where ``new`` differs from the running config."""
    a, b = running.model_dump(), new.model_dump()
    out: list[str] = []
    for key in a:
        if a[key] == b[key]:
            continue
        if isinstance(a[key], dict) and isinstance(b[key], dict):
            out.extend(f"{key}.{k}" for k in a[key] if a[key][k] != b[key].get(k))
        else:
            out.append(key)
    return tuple(out)


def _consumer_changes(
    old: tuple[Plugin, ...], new: tuple[Plugin, ...], config: RouterConfig
) -> tuple[ConfigIssue, ...]:
    """A KV-event consumer added, removed or rebuilt: its event streams were wired at start."""
    old_ids = {id(p) for p in old if isinstance(p, KVEventConsumer)}
    new_ids = {id(p) for p in new if isinstance(p, KVEventConsumer)}
    if old_ids == new_ids:
        return ()
    changed = {
        p.name for p in (*old, *new) if isinstance(p, KVEventConsumer) and id(p) not in old_ids & new_ids
    }
    index = {s.instance_name: i for i, s in enumerate(config.plugins)}
    return tuple(
        ConfigIssue(
            f"plugins[{index[name]}]" if name in index else "plugins",
            f"plugin {name!r} consumes KV events: adding, removing or changing it takes a restart",
        )
        for name in sorted(changed)
    )


def _endpoint_changes(old: RouterConfig, new: RouterConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    before = {e.endpoint_name: e.url for e in old.endpoints}
    after = {e.endpoint_name: e.url for e in new.endpoints}
    added = tuple(sorted(n for n, url in after.items() if before.get(n) != url))
    removed = tuple(sorted(n for n, url in before.items() if after.get(n) != url))
    return added, removed
