"""``burstsched config show``: the effective config, every default filled in, and where each value came from.

The file is read as ``serve`` reads it (either format). Each value is marked with its origin:

- ``file``: written in the file (burstsched's format);
- ``llm-d``: set by the translation of an llm-d ``EndpointPickerConfig`` (the file's value, or the llm-d
  default the translation fills in where llm-d has one that differs from burstsched's);
- ``default``: burstsched's default; a plugin's parameters not given take its parameters model's defaults.

Origins come from what pydantic records as set on each model (``model_fields_set``), so a section the
file leaves out is ``default`` all through, and a list the file writes (``plugins``, ``endpoints``) carries
each item's own marks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

from burstsched.config import ConfigError, LoadedConfig, PluginSpec, read_config
from burstsched.framework import PluginRegistry, PluginTypeError

EXIT_OK = 0
EXIT_INVALID = 1
DEFAULT = "default"
_COMMENT_COLUMN = 56


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the output: its text, the value's dotted path, and its origin (None on a heading)."""

    text: str
    path: str
    origin: str | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = sub.add_parser(
        "show",
        help="print the effective config with every default filled in, and where each value came from",
        description="Print the effective config with every default filled in; each value is marked file "
        "(written in the file), llm-d (set by the translation of an llm-d EndpointPickerConfig) or default.",
    )
    show.add_argument(
        "--config", type=Path, required=True, metavar="FILE", help="a YAML config (either format)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        loaded = read_config(args.config)
        registry = PluginRegistry.discover()
    except ConfigError as exc:
        print(f"{args.config}: invalid", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_INVALID
    except PluginTypeError as exc:
        print(f"burstsched config show: {exc}", file=sys.stderr)
        return EXIT_INVALID
    show(args.config, loaded, registry, out=sys.stdout)
    return EXIT_OK


def show(path: Path | str, loaded: LoadedConfig, registry: PluginRegistry, *, out: TextIO) -> None:
    """Print the effective config, each value followed by ``# ORIGIN``."""
    print(f"# {path}: {loaded.origin}; each value: {_origin(loaded)} or default", file=out)
    for line in effective_lines(loaded, registry):
        if line.origin is None:
            print(line.text, file=out)
        else:
            print(f"{line.text.ljust(_COMMENT_COLUMN)}  # {line.origin}", file=out)


def effective_lines(loaded: LoadedConfig, registry: PluginRegistry) -> list[Line]:
    """The effective config as YAML lines, each value with its path and origin."""
    return list(_model(loaded.config, _origin(loaded), "", 0, registry))


def origins(loaded: LoadedConfig, registry: PluginRegistry) -> dict[str, str]:
    """Each value's dotted path (``admission.window_ms``, ``plugins[0].type``) and its origin."""
    return {line.path: line.origin for line in effective_lines(loaded, registry) if line.origin is not None}


def _origin(loaded: LoadedConfig) -> str:
    return "llm-d" if loaded.origin.startswith("llm-d") else "file"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _model(model: BaseModel, origin: str, path: str, indent: int, registry: PluginRegistry) -> Iterator[Line]:
    """A model's fields; ``origin`` marks the fields it records as set (DEFAULT: none are)."""
    for name in type(model).model_fields:
        mark = origin if origin != DEFAULT and name in model.model_fields_set else DEFAULT
        yield from _field(name, getattr(model, name), mark, _join(path, name), indent, registry)


def _field(
    name: str, value: Any, mark: str, path: str, indent: int, registry: PluginRegistry
) -> Iterator[Line]:
    pad = " " * indent
    if isinstance(value, BaseModel):
        yield Line(f"{pad}{name}:", path, None)
        yield from _model(value, mark, path, indent + 2, registry)
    elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        yield Line(f"{pad}{name}:", path, None)
        for i, item in enumerate(value):
            lines = list(_item(item, mark, f"{path}[{i}]", indent + 4, registry))
            first = lines[0]
            yield Line(f"{pad}  - {first.text.lstrip()}", first.path, first.origin)
            yield from lines[1:]
    else:
        yield Line(f"{pad}{name}: {_scalar(value)}", path, mark)


def _item(model: BaseModel, origin: str, path: str, indent: int, registry: PluginRegistry) -> Iterator[Line]:
    if not isinstance(model, PluginSpec):
        yield from _model(model, origin, path, indent, registry)
        return
    pad = " " * indent
    given = model.model_fields_set if origin != DEFAULT else set()

    def mark(field: str) -> str:
        return origin if field in given else DEFAULT

    yield Line(f"{pad}type: {_scalar(model.type)}", _join(path, "type"), mark("type"))
    yield Line(f"{pad}name: {_scalar(model.instance_name)}", _join(path, "name"), mark("name"))
    params = _parameters(model, registry)
    where = _join(path, "parameters")
    if not params:
        yield Line(f"{pad}parameters: {{}}", where, mark("parameters"))
        return
    yield Line(f"{pad}parameters:", where, None)
    written = model.parameters if "parameters" in given else {}
    for key, value in params.items():
        yield Line(
            f"{pad}  {key}: {_scalar(value)}", _join(where, key), origin if key in written else DEFAULT
        )


def _parameters(spec: PluginSpec, registry: PluginRegistry) -> dict[str, Any]:
    """The plugin's parameters with its model's defaults filled in (as given, when the type is unknown)."""
    factory = registry.get(spec.type)
    if factory is None:
        return dict(spec.parameters)
    try:
        model = factory.Parameters.model_validate(spec.parameters)
    except ValidationError:
        return dict(spec.parameters)
    dumped = model.model_dump(mode="json")
    return {**dumped, **{k: v for k, v in spec.parameters.items() if k not in dumped}}


def _scalar(value: Any) -> str:
    """A value as YAML flow style writes it (JSON is valid YAML flow)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, default=str)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value) if _needs_quotes(value) else value
    if isinstance(value, float) and "e" in repr(value) and "." not in repr(value):
        mantissa, exponent = repr(value).split("e")
        return f"{mantissa}.0e{exponent}"  # YAML reads 1e-09 as a string, 1.0e-09 as a float
    return json.dumps(value, default=str)


def _needs_quotes(text: str) -> bool:
    return (
        text == ""
        or text.strip() != text
        or text.lower() in ("null", "true", "false", "yes", "no", "on", "off", "~")
        or any(c in text for c in ":#{}[],&*!|>'\"%@`")
        or text[0] in "-?"
        or _is_number(text)
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
