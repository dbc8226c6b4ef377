"""Configuration errors: every issue names the path of the field it is about.

::

    ConfigError          one or more ConfigIssue(path, message), printed one per line as "path: message"
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: ``path`` like ``plugins[2].parameters.block_tokens`` (empty for the whole document)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """A configuration that cannot be used."""

    def __init__(self, issues: Sequence[ConfigIssue], source: str | None = None) -> None:
        self.issues = tuple(issues)
        self.source = source
        head = f"invalid configuration{f' {source}' if source else ''}"
        super().__init__("\n".join([head + ":", *(f"  {issue}" for issue in self.issues)]))


def format_path(loc: Iterable[str | int]) -> str:
    """``("plugins", 2, "parameters", "x")`` → ``plugins[2].parameters.x``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def join_path(prefix: str, path: str) -> str:
    """Append ``path`` (which may start with ``[i]``) to ``prefix``."""
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def issues_from_validation(error: ValidationError, prefix: str = "") -> list[ConfigIssue]:
    """One issue per pydantic error, its path under ``prefix``."""
    issues = []
    for item in error.errors(include_url=False):
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        issues.append(ConfigIssue(join_path(prefix, format_path(item["loc"])), message))
    return issues
