"""Reading an llm-d plugin's ``parameters`` strictly: typed values, bounds, and every key accounted for.

Each read records the key as used; :meth:`Params.finish` reports every key no read took, so a parameter the
translation does not know is refused, never ignored. Every issue names the plugin (type and instance name)
and the parameter's path in the llm-d document, e.g.
``plugins[0].parameters.autoTune: approx-prefix-cache-producer 'approx': ...``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from burstsched.config.errors import ConfigIssue, join_path

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
_QUANTITY_SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    "m": Decimal("0.001"),
    "": Decimal(1),
}


def parse_duration_ms(text: str) -> float | None:
    """A Go duration (``200ms``, ``2s``, ``1m30s``) in milliseconds; ``None`` if ``text`` is not one."""
    if text in ("0", "-0", "+0"):
        return 0.0
    body = text.lstrip("+")
    if not body or body.startswith("-"):
        return None
    position = 0
    total = 0.0
    for match in _DURATION_PART.finditer(body):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        position = match.end()
    return total if position == len(body) and position > 0 else None


def parse_quantity(value: object) -> int | None:
    """A Kubernetes resource quantity (``500``, ``"1k"``, ``"10Gi"``, ``"1e3"``) as an integer, rounded up as
    Kubernetes' ``Value()`` does; ``None`` if ``value`` is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return math.ceil(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            amount = Decimal(number) * Decimal(10) ** int(suffix[1:])
        else:
            amount = Decimal(number) * _QUANTITY_SUFFIX[suffix]
    except (InvalidOperation, OverflowError):
        return None
    return math.ceil(amount)


class Params:
    """One plugin's parameters (or a nested object of them), read key by key."""

    def __init__(self, raw: object, path: str, plugin: str, issues: list[ConfigIssue]) -> None:
        self.path = path
        self.plugin = plugin
        self._issues = issues
        self._used: set[str] = set()
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
            self.issue("", "must be a mapping")
            raw = {}
        self._raw: Mapping[str, Any] = raw

    def issue(self, key: str, message: str) -> None:
        """Report a problem with ``key`` (or with the whole object when ``key`` is empty)."""
        self._issues.append(ConfigIssue(join_path(self.path, key), f"{self.plugin}: {message}"))

    def has(self, key: str) -> bool:
        return key in self._raw

    def _take(self, key: str) -> Any:
        self._used.add(key)
        return self._raw.get(key)

    def integer(
        self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.issue(key, f"must be an integer, got {value!r}")
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            self.issue(key, f"must be {_bounds(minimum, maximum)}, got {value}")
            return default
        return value

    def number(
        self, key: str, default: float, *, minimum: float | None = None, maximum: float | None = None
    ) -> float:
        value = self._take(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.issue(key, f"must be a number, got {value!r}")
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            self.issue(key, f"must be {_bounds(minimum, maximum)}, got {value}")
            return default
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._take(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.issue(key, f"must be true or false, got {value!r}")
            return default
        return value

    def text(self, key: str, default: str, *, choices: Sequence[str] | None = None) -> str:
        value = self._take(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.issue(key, f"must be a string, got {value!r}")
            return default
        if choices is not None and value not in choices:
            self.issue(key, f"must be one of {', '.join(choices)}; got {value!r}")
            return default
        return value

    def duration_ms(self, key: str, default_ms: float, *, positive: bool = True) -> float:
        """A Go duration string (``"200ms"``, ``"2s"``), in milliseconds."""
        value = self._take(key)
        if value is None:
            return default_ms
        parsed = parse_duration_ms(value) if isinstance(value, str) else None
        if parsed is None:
            self.issue(key, f'must be a duration such as "200ms" or "2s", got {value!r}')
            return default_ms
        if positive and parsed <= 0:
            self.issue(key, f"must be a positive duration, got {value!r}")
            return default_ms
        return parsed

    def quantity(self, key: str) -> int | None:
        """A non-negative Kubernetes resource quantity (``"1k"``, ``"10Gi"``); ``None`` when absent."""
        value = self._take(key)
        if value is None:
            return None
        parsed = parse_quantity(value)
        if parsed is None:
            self.issue(key, f'must be a quantity such as 500, "1k" or "10Gi", got {value!r}')
            return None
        if parsed < 0:
            self.issue(key, f"must be non-negative, got {value!r}")
            return None
        return parsed

    def strings(self, key: str) -> list[str]:
        """A list of strings (empty when absent)."""
        value = self._take(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.issue(key, f"must be a list of strings, got {value!r}")
            return []
        return list(value)

    def string_map(self, key: str) -> dict[str, str]:
        """A mapping of strings to strings (empty when absent)."""
        value = self._take(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self.issue(key, f"must be a mapping of strings to strings, got {value!r}")
            return {}
        return dict(value)

    def nested(self, key: str) -> Params:
        """The object under ``key`` (empty when absent), read the same way; call its :meth:`finish` too."""
        return Params(self._take(key), join_path(self.path, key), self.plugin, self._issues)

    def entries(self, key: str) -> list[Params]:
        """The objects of the list under ``key`` (empty when absent), each read as :meth:`nested` is."""
        value = self._take(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.issue(key, f"must be a list, got {value!r}")
            return []
        return [
            Params(v, f"{join_path(self.path, key)}[{i}]", self.plugin, self._issues)
            for i, v in enumerate(value)
        ]

    def accept(self, *keys: str) -> None:
        """Keys whose value changes nothing in burstsched (e.g. a worker count); taken as they are."""
        self._used.update(keys)

    def accept_all(self) -> None:
        """Every key, as it is: the parameters of a plugin refused as a whole say nothing more."""
        self._used.update(self._raw)

    def refuse(self, key: str, why: str) -> None:
        """``key``, when present, is a parameter burstsched cannot honour."""
        if key in self._raw:
            self._used.add(key)
            self.issue(key, f"not supported: {why}")

    def finish(self) -> None:
        """Refuse every key no read took."""
        for key in self._raw:
            if key not in self._used:
                self.issue(key, "unknown or unsupported parameter")


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"between {minimum} and {maximum}"
    if minimum is not None:
        return f"at least {minimum}"
    return f"at most {maximum}"
