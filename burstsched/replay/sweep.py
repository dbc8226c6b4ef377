"""Config variants: ``--sweep key=v1,v2`` over dotted paths, validated against the config model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from burstsched.config import RouterConfig


class SweepError(ValueError):
    """A sweep argument that names no config field, or a value the field refuses."""


@dataclass(frozen=True, slots=True)
class Axis:
    path: tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def key(self) -> str:
        return ".".join(self.path)


def parse_axis(text: str) -> Axis:
    """``a.b.c=v1,v2``: each value read as YAML (``5`` an int, ``true`` a bool, ``x`` a string)."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise SweepError(f"--sweep wants key=v1,v2,...: {text!r}")
    parsed = tuple(yaml.safe_load(v) for v in values.split(","))
    return Axis(tuple(key.split(".")), parsed)


def _set(node: Any, path: Sequence[str], value: Any, full: str) -> None:
    """Set ``path`` in a config document. A list is indexed by position or by an item's ``name``,
    ``plugin_ref`` or ``type`` (``profile.plugins.prefix-cache-scorer.weight``)."""
    head, rest = path[0], path[1:]
    if isinstance(node, list):
        index = next(
            (i for i, item in enumerate(node) if isinstance(item, dict) and head in _names(item)),
            int(head) if head.isdigit() and int(head) < len(node) else None,
        )
        if index is None:
            raise SweepError(f"--sweep {full}: no item {head!r} in the list")
        if not rest:
            node[index] = value
        else:
            _set(node[index], rest, value, full)
        return
    if not isinstance(node, dict):
        raise SweepError(f"--sweep {full}: {head!r} is below a value, not a section")
    if not rest:
        node[head] = value
        return
    if head not in node or node[head] is None:
        node[head] = {}
    _set(node[head], rest, value, full)


def _names(item: dict[str, Any]) -> set[str]:
    return {str(item[k]) for k in ("name", "plugin_ref", "type") if k in item}


def variant(base: RouterConfig, settings: Sequence[tuple[Axis, Any]]) -> RouterConfig:
    """``base`` with each axis set to its value; :class:`SweepError` when the result is no valid config."""
    document = base.model_dump(mode="json")
    for axis, value in settings:
        _set(document, axis.path, value, axis.key)
    try:
        return RouterConfig.model_validate(document)
    except ValueError as exc:
        shown = ", ".join(f"{a.key}={v}" for a, v in settings)
        raise SweepError(f"--sweep {shown}: not a valid config: {exc}") from None


def grid(base: RouterConfig, axes: Sequence[Axis]) -> list[tuple[str, RouterConfig]]:
    """Every combination of the axes' values, labelled ``key=value ...`` (all validated up front)."""
    points: list[tuple[str, RouterConfig]] = []
    for values in itertools.product(*(axis.values for axis in axes)):
        settings = list(zip(axes, values, strict=True))
        label = " ".join(
            f"{axis.path[-1] if axis.path[-1] != 'weight' else axis.path[-2]}={value}"
            for axis, value in settings
        )
        points.append((label, variant(base, settings)))
    return points
