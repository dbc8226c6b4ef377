"""The configuration's JSON schema, generated from the models.

``python -m burstsched.config.schema [PATH]`` writes it (default ``config/schema.json``); a test keeps the
committed file fresh. The built-in plugin types' parameter models are included, each under an ``if type is
...`` clause of the plugin entry; third-party plugin parameters are left open.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from burstsched.config.models import RouterConfig

DEFAULT_PATH = Path("config") / "schema.json"
_PLUGIN_GROUP = "burstsched.plugins"
_BUILT_IN_DISTRIBUTION = "burstsched"


def _built_in_parameter_models() -> dict[str, type[BaseModel]]:
    models: dict[str, type[BaseModel]] = {}
    for entry in entry_points(group=_PLUGIN_GROUP):
        if entry.dist is None or entry.dist.name != _BUILT_IN_DISTRIBUTION:
            continue
        parameters = getattr(entry.load(), "Parameters", None)
        if isinstance(parameters, type) and issubclass(parameters, BaseModel):
            models[entry.name] = parameters
    return dict(sorted(models.items()))


def build_schema() -> dict[str, Any]:
    """The schema of :class:`RouterConfig`, with the built-in plugins' parameters."""
    schema = RouterConfig.model_json_schema(mode="validation")
    plugin_spec = schema["$defs"]["PluginSpec"]
    clauses = []
    for type_name, model in _built_in_parameter_models().items():
        parameters = model.model_json_schema(mode="validation")
        parameters.pop("title", None)
        clauses.append(
            {
                "if": {"properties": {"type": {"const": type_name}}, "required": ["type"]},
                "then": {"properties": {"parameters": parameters}},
            }
        )
    if clauses:
        plugin_spec["allOf"] = clauses
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def render_schema() -> str:
    """:func:`build_schema` as pretty JSON text with a trailing newline."""
    return json.dumps(build_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT_PATH
    path.write_text(render_schema(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
