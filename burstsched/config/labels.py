"""Kubernetes label keys and values, checked as Kubernetes checks them (for endpoint labels and selectors)."""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_label_key(key: str) -> str:
    """``key`` when it is a Kubernetes label key (``[prefix/]name``), else :class:`ValueError`."""
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        raise ValueError(f"label key {key!r}: the prefix must be a DNS subdomain of at most 253 characters")
    if len(name) > 63 or not _NAME.fullmatch(name):
        raise ValueError(
            f"label key {key!r}: the name must be 1 to 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return key


def check_label_value(value: str) -> str:
    """``value`` when it is a Kubernetes label value (empty, or a name of at most 63 characters)."""
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise ValueError(
            f"label value {value!r}: must be empty or 1 to 63 letters, digits, '-', '_' or '.', starting and "
            "ending with a letter or digit"
        )
    return value
