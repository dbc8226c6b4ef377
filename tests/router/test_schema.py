from __future__ import annotations

import json
from pathlib import Path

from burstsched.config.schema import build_schema, render_schema

REPO = Path(__file__).resolve().parents[2]


def test_committed_schema_is_fresh() -> None:
    committed = (REPO / "config" / "schema.json").read_text(encoding="utf-8")
    assert committed == render_schema(), (
        "config/schema.json is stale: run `python -m burstsched.config.schema`"
    )


def test_schema_forbids_unknown_fields_and_covers_builtin_plugin_parameters() -> None:
    schema = build_schema()
    assert schema["additionalProperties"] is False
    clauses = schema["$defs"]["PluginSpec"]["allOf"]
    by_type = {c["if"]["properties"]["type"]["const"]: c["then"]["properties"]["parameters"] for c in clauses}
    assert "max-score-picker" in by_type
    assert by_type["max-score-picker"]["properties"]["tie_break"]["enum"] == ["least-recent", "random"]
    json.dumps(schema)
