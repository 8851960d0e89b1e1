"""The one exception the data readers raise for corrupt, incomplete or inconsistent input."""

from __future__ import annotations

from pathlib import Path


class DataError(Exception):
    """A dataset file is missing, truncated, incomplete or inconsistent.

    The message always names the file and, where it applies, the HDF5 key or the line number, so
    a user can find the problem without a debugger: ``data.h5: key '/ovc/rgb/data': missing``.
    """

    def __init__(
        self, path: str | Path, message: str, *, key: str | None = None, line: int | None = None
    ) -> None:
        self.path = Path(path)
        self.key = key
        self.line = line
        where = str(self.path)
        if line is not None:
            where += f":{line}"
        if key is not None:
            where += f": key '{key}'"
        super().__init__(f"{where}: {message}")
