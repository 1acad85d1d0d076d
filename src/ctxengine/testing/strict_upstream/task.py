"""The scripted task (files ``part01.txt`` … to read) and the scripted model's reply."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
MARKER = re.compile(r"MARKER part(\d+) = ([A-Z0-9]+)")


def file_code(i: int) -> str:
    """The code written on the MARKER line of file ``i``."""
    return hashlib.sha256(f"part{i}".encode()).hexdigest()[:10].upper()


@dataclass
class Task:
    """The scripted task: ``steps`` files of about ``file_tokens`` o200k tokens under ``root``."""

    root: Path
    steps: int = 12
    file_tokens: int = 3000
    prompt: str = ""

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.prompt:
            self.prompt = (
                f"BENCH-TASK: the folder {self.root} holds part01.txt to part{self.steps:02d}.txt. Read them one "
                "at a time, in order, and when all are read report the line 'MARKER partNN = CODE' of each."
            )

    def name(self, i: int) -> str:
        return f"part{i:02d}.txt"

    def path(self, i: int) -> Path:
        return self.root / self.name(i)

    def code(self, i: int) -> str:
        return file_code(i)

    def write(self) -> None:
        """Write the task's files (about 4.3 characters per o200k token of this text)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for i in range(1, self.steps + 1):
            lines = [f"MARKER part{i:02d} = {file_code(i)}"]
            n = 0
            while n < self.file_tokens:
                words = [_WORDS[(i * 7 + n + k * 3) % len(_WORDS)] for k in range(12)]
                lines.append(f"{i:02d}.{n:05d} " + " ".join(words))
                n += 16
            self.path(i).write_text("\n".join(lines) + "\n", encoding="utf-8")


@dataclass
class Reply:
    """What the script answers: text, or one tool call (``tool`` name and ``args`` object)."""

    text: str | None = None
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    tool_kind: str = "function"  # or "local_shell" (Responses' built-in shell)
