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
    reread: tuple[int, int] | None = None
    """``(after, file)``: once file ``after`` is read, ask for file ``file`` again (a re-read of
    an unchanged file, which Claude Code and Qwen Code answer with "unchanged since last
    read"); the next request is checked for that file's content (``stats['reread']``)."""

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

    def content_line(self, i: int) -> str:
        """A line of file ``i``'s body (not its MARKER line, which digests may keep): the
        request holds the file's content when it holds this line."""
        n = (self.file_tokens // 32) * 16
        words = [_WORDS[(i * 7 + n + k * 3) % len(_WORDS)] for k in range(12)]
        return f"{i:02d}.{n:05d} " + " ".join(words)

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
