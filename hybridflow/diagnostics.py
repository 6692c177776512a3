"""Problems found in a pipeline file, each located at file:line:col, and "did you mean" hints."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import Iterable, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Problem:
    file: str
    line: int
    col: int
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.message}"

    def as_dict(self) -> dict:
        return asdict(self)


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """A ' (did you mean 'x'?)' suffix when a candidate is close enough, else ''."""
    pool = sorted({str(c) for c in candidates})
    close = difflib.get_close_matches(str(word), pool, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in pool}
        if str(word).lower() in lowered:
            close = [lowered[str(word).lower()]]
    return f" (did you mean '{close[0]}'?)" if close else ""


def errors_in(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]
