"""Loading the configuration, stage one: strict decode of YAML into :class:`RouterConfig`.

Both formats load the same way: burstsched's own, and llm-d's ``EndpointPickerConfig``
(:mod:`burstsched.config.llmd`), recognised by its ``apiVersion``/``kind``.

The later stages (build plugins, validate references, wire the scheduler) live in
:mod:`burstsched.scheduling.builder`; every stage reports errors as :class:`ConfigError` with field paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from burstsched.config.errors import ConfigError, ConfigIssue, issues_from_validation
from burstsched.config.llmd import is_kubernetes_document, translate_llmd
from burstsched.config.models import EndpointConfig, RouterConfig
from burstsched.config.tokenizer import TokenizerConfig


def decode_config(data: Any, *, source: str | None = None) -> RouterConfig:
    """Validate a decoded document (``None`` counts as empty) into a :class:`RouterConfig`."""
    if data is None:
        data = {}
    if is_kubernetes_document(data):
        return _checked(translate_llmd([data], source=source).config, source)
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", "the configuration must be a mapping")], source)
    try:
        config = RouterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(issues_from_validation(exc), source) from None
    issues = check_names(config)
    if issues:
        raise ConfigError(issues, source)
    return config


def check_names(config: RouterConfig) -> list[ConfigIssue]:
    """Endpoint and plugin names must be unique."""
    issues: list[ConfigIssue] = []
    seen: set[str] = set()
    for i, endpoint in enumerate(config.endpoints):
        if endpoint.endpoint_name in seen:
            issues.append(
                ConfigIssue(f"endpoints[{i}].name", f"duplicate endpoint name {endpoint.endpoint_name!r}")
            )
        seen.add(endpoint.endpoint_name)
    seen = set()
    for i, plugin in enumerate(config.plugins):
        if plugin.instance_name in seen:
            issues.append(
                ConfigIssue(f"plugins[{i}].name", f"duplicate plugin name {plugin.instance_name!r}")
            )
        seen.add(plugin.instance_name)
    return issues


def _checked(config: RouterConfig, source: str | None) -> RouterConfig:
    issues = check_names(config)
    if issues:
        raise ConfigError(issues, source)
    return config


@dataclass(frozen=True)
class LoadedConfig:
    """A configuration, the format it was written in, and notes on how it was read."""

    config: RouterConfig
    origin: str = "burstsched format"
    notes: tuple[str, ...] = ()
    explain: tuple[str, ...] = ()  # llm-d files: what each llm-d plugin became


def parse_config_document(text: str, *, source: str | None = None) -> LoadedConfig:
    """Parse YAML text: burstsched's own format, or llm-d's ``EndpointPickerConfig`` (translated)."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue("", f"not valid YAML: {exc}")], source) from None
    if len(documents) > 1:
        documents = [doc for doc in documents if doc is not None]
    if any(is_kubernetes_document(doc) for doc in documents):
        translation = translate_llmd(documents, source=source)
        origin = f"llm-d EndpointPickerConfig {translation.api_version}, translated"
        config = _checked(translation.config, source)
        return LoadedConfig(config, origin, translation.notes, translation.explain)
    if len(documents) > 1:
        message = "a burstsched configuration is one YAML document (several: llm-d's EndpointPickerConfig)"
        raise ConfigError([ConfigIssue("", message)], source)
    return LoadedConfig(decode_config(documents[0] if documents else None, source=source))


def parse_config_text(text: str, *, source: str | None = None) -> RouterConfig:
    """Parse YAML text into a :class:`RouterConfig` (either format, see :func:`parse_config_document`)."""
    return parse_config_document(text, source=source).config


def read_config(path: str | Path, *, endpoints: Sequence[EndpointConfig] | None = None) -> LoadedConfig:
    """Read a YAML config file; ``endpoints``, when given and not empty, replace the file's list."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue("", f"cannot read: {exc}")], str(path)) from None
    loaded = parse_config_document(text, source=str(path))
    if endpoints:
        config = _checked(loaded.config.with_endpoints(list(endpoints)), "(command line endpoints)")
        loaded = LoadedConfig(config, loaded.origin, loaded.notes, loaded.explain)
    return loaded


def load_config(path: str | Path, *, endpoints: Sequence[EndpointConfig] | None = None) -> RouterConfig:
    """Read a YAML config file (either format); ``endpoints``, when given and not empty, replace its list."""
    return read_config(path, endpoints=endpoints).config


def parse_endpoint_arg(text: str) -> EndpointConfig:
    """``URL`` or ``NAME=URL`` from the command line."""
    name: str | None = None
    url = text
    head, sep, tail = text.partition("=")
    if sep and "://" not in head:
        name, url = head, tail
    try:
        return EndpointConfig(url=url, name=name)
    except ValidationError as exc:
        issues = issues_from_validation(exc, prefix="--endpoint")
        raise ConfigError(issues, repr(text)) from None


def attach_kv_events(
    config: RouterConfig, events: Sequence[str], replays: Sequence[str] = ()
) -> RouterConfig:
    """``config`` with the command line's ``--kv-events NAME=ADDRESS`` (and ``--kv-events-replay``) set on
    the named endpoints."""
    by_flag = {"--kv-events": ("kv_events", events), "--kv-events-replay": ("kv_events_replay", replays)}
    updates: dict[str, dict[str, str]] = {}
    issues: list[ConfigIssue] = []
    names = {e.endpoint_name for e in config.endpoints}
    for flag, (field, values) in by_flag.items():
        for text in values:
            name, sep, address = text.partition("=")
            if not sep or not name or not address:
                issues.append(ConfigIssue(flag, f"expected NAME=ADDRESS, got {text!r}"))
            elif name not in names:
                known = ", ".join(sorted(names)) or "none"
                issues.append(ConfigIssue(flag, f"unknown endpoint {name!r} (endpoints: {known})"))
            else:
                updates.setdefault(name, {})[field] = address
    if issues:
        raise ConfigError(issues, "(command line)")
    endpoints: list[EndpointConfig] = []
    for endpoint in config.endpoints:
        fields = updates.get(endpoint.endpoint_name)
        if fields is None:
            endpoints.append(endpoint)
            continue
        try:
            endpoints.append(EndpointConfig.model_validate({**endpoint.model_dump(), **fields}))
        except ValidationError as exc:
            raise ConfigError(
                issues_from_validation(exc, prefix="--kv-events"), endpoint.endpoint_name
            ) from None
    return config.with_endpoints(endpoints)


def with_tokenizer(config: RouterConfig, text: str) -> RouterConfig:
    """``config`` with the command line's ``--tokenizer PATH`` (local files) or ``--tokenizer remote``."""
    fields = {"source": "remote"} if text == "remote" else {"source": "local", "path": text}
    try:
        tokenizer = TokenizerConfig.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(issues_from_validation(exc, prefix="--tokenizer"), repr(text)) from None
    return config.model_copy(update={"tokenizer": tokenizer})
