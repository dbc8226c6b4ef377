"""A JSONL file rotated by size: ``path`` → ``path.1`` → ``path.2``… up to ``backups`` (blocking I/O; the
recorder calls it from its flush, on the event loop)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


class RotatingFile:
    """Appends whole lines; once the file is at least ``max_bytes`` long it is rotated (or truncated when
    ``backups`` is 0) before the next write, so a line is never split across files. ``header()``, when
    given, is written first in each new file after a rotation (lines a reader of that file alone needs)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_bytes: int,
        backups: int,
        header: Callable[[], bytes] | None = None,
    ) -> None:
        self.path = Path(path)
        self._header = header
        self._max_bytes = max_bytes
        self._backups = backups
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._size = self._file.tell()
        self.rotations = 0

    def write(self, data: bytes) -> None:
        if self._size >= self._max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        if self._backups > 0:
            for index in range(self._backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
            self._file = open(self.path, "ab")  # noqa: SIM115
        else:
            self._file = open(self.path, "wb")  # noqa: SIM115
        self._size = 0
        self.rotations += 1
        if self._header is not None:
            header = self._header()
            self._file.write(header)
            self._size += len(header)

    def close(self) -> None:
        self._file.close()
