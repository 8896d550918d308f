"""What an import says is wrong with its input: a file that is not in the format
(:class:`ImportFormatError`), one bad record (:class:`Bad` where it is found, :class:`Problem` as
reported), and the refusal of an import
whose records are not all good (:class:`MalformedInput`). Each is a :class:`~studio.errors.StudioError`
with a message that names the file and what to do.
"""
from __future__ import annotations

from dataclasses import dataclass

from studio.errors import StudioError


class ImportFormatError(StudioError, ValueError):
    """A file is not what its importer expects; the message names the missing fields and the ones it has."""


class Bad(ValueError):
    """One record is malformed (the message says why); the reader turns it into a :class:`Problem`."""


class MalformedInput(StudioError, ValueError):
    """Records that cannot be imported; ``problems`` lists them (file, line, why). Nothing was written."""

    def __init__(self, problems: list[Problem], total: int | None = None):
        self.problems = problems
        n = total or len(problems)
        head = "; ".join(str(p) for p in problems[:3]) + (" …" if n > 3 else "")
        super().__init__(f"{n} malformed record{'s' * (n != 1)}, nothing was imported "
                         f"(on_error='skip' / --skip-bad imports the rest): {head}")


@dataclass
class Problem:
    """One record (or a whole file, ``line`` None) that could not be imported."""

    file: str
    line: int | None  # 1-based line of a JSONL file; row of a Parquet or table file
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line is not None else f"{self.file}: {self.message}"
