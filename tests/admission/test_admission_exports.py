"""The package's public names are exactly its ``__all__``."""

from __future__ import annotations

import types

import burstsched.admission as admission


def test_exported_members() -> None:
    public = {
        name
        for name, value in vars(admission).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert sorted(admission.__all__) == sorted(public)
