"""The plugin registry: plugin types by name, found through the ``burstsched.plugins`` entry-point group.

A plugin type is a class (or any callable) with a ``Parameters`` attribute, a pydantic model of its
parameters, called as ``factory(name, parameters, context)``. The entry point's name is the type name::

    [project.entry-points."burstsched.plugins"]
    queue-scorer = "burstsched_plugins.queue_scorer:QueueScorer"
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

from pydantic import BaseModel, ConfigDict

from burstsched.framework.plugins import Plugin
from burstsched.framework.saturation import Saturation

ENTRY_POINT_GROUP = "burstsched.plugins"


class PluginParameters(BaseModel):
    """Base of every plugin's parameters model: strict, unknown fields refused, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


@dataclass(frozen=True)
class PluginContext:
    """What a plugin may depend on besides its parameters: the injected RNG and monotonic clock, and the
    router's definition of a saturated endpoint (the config's ``saturation:``)."""

    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    saturation: Saturation = field(default_factory=Saturation)


class PluginFactory(Protocol):
    """A plugin type: its parameters model, and a call that builds an instance."""

    @property
    def Parameters(self) -> type[BaseModel]: ...  # noqa: N802 - the attribute is a class

    def __call__(self, name: str, parameters: Any, context: PluginContext) -> Plugin: ...


class PluginTypeError(Exception):
    """An entry point or registration that is not a usable plugin type."""


class PluginRegistry:
    """Plugin types by type name."""

    def __init__(self, types: Mapping[str, PluginFactory] | None = None) -> None:
        self._types: dict[str, PluginFactory] = {}
        for type_name, factory in (types or {}).items():
            self.register(type_name, factory)

    @classmethod
    def discover(cls, group: str = ENTRY_POINT_GROUP) -> PluginRegistry:
        """A registry of every plugin type installed under the entry-point ``group``."""
        registry = cls()
        for entry in entry_points(group=group):
            try:
                loaded = entry.load()
            except Exception as exc:
                raise PluginTypeError(
                    f"plugin type {entry.name!r} ({entry.value}) failed to load: {exc}"
                ) from exc
            registry.register(entry.name, loaded)
        return registry

    def register(self, type_name: str, factory: object) -> None:
        """Add a plugin type; a name can be registered once."""
        if type_name in self._types:
            raise PluginTypeError(f"plugin type {type_name!r} is registered twice")
        parameters = getattr(factory, "Parameters", None)
        if not callable(factory) or not (isinstance(parameters, type) and issubclass(parameters, BaseModel)):
            raise PluginTypeError(
                f"plugin type {type_name!r} must be callable and carry a pydantic `Parameters` model"
            )
        self._types[type_name] = cast(PluginFactory, factory)

    def get(self, type_name: str) -> PluginFactory | None:
        return self._types.get(type_name)

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._types

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._types))

    def __len__(self) -> int:
        return len(self._types)
