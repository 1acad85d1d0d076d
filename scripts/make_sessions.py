#!/usr/bin/env python
"""Write SWE-agent-style sessions for the tests (``swe_agent_like_synthetic.jsonl``).

The recorded SWE-agent runs the benchmarks use (Multi-SWE-bench's Java trajectories, see
``tests/data/README.md``) carry no licence, so the repository cannot ship them. These sessions
take their place in the tests: they have the same shape — SWE-agent 0.x's interface commands
(``find_file``, ``search_dir``, ``open``/``goto``/``scroll_down`` showing 100-line windows of a
file, ``edit``, ``create``, ``submit``) sent as one ``bash`` tool call per assistant turn that
starts with ``DISCUSSION``, Maven builds and test runs with Java stack traces, recursive
listings full of paths, issue texts with URLs, a user coming back with a constraint, and a
final diff — but every word is ours: invented Java projects, invented code, invented issues.

Six sessions of 13 to 88 steps (about 5K to 60K o200k tokens; the longest one makes a 32K
window compact several times). The output is deterministic (a seeded ``random.Random``, no
clock): run it again and the file is the same byte for byte (a test checks it).

The tests generate them when they start (``tests/conftest.py``); nothing is kept in the
repository. Usage: ``python scripts/make_sessions.py [OUT]`` (standard output without OUT).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SOURCE = "ctxengine scripts/make_sessions.py (synthetic)"

SYSTEM = """SETTING: You are an autonomous programmer working in a command line with a special interface.

The interface has a file viewer that shows 100 lines of a file at a time, and these commands
besides ordinary shell commands:

open <path> [<line_number>]
  opens the file at path in the viewer; with line_number the window moves to include that line
goto <line_number>
  moves the window to show line_number
scroll_down / scroll_up
  moves the window down or up 100 lines
create <filename>
  creates and opens a new file
search_dir <search_term> [<dir>]
  searches every file in dir (default: the current directory) for search_term
search_file <search_term> [<file>]
  searches file (default: the open file) for search_term
find_file <file_name> [<dir>]
  finds every file named file_name in dir
edit <start_line>:<end_line>
<replacement_text>
end_of_edit
  replaces lines start_line through end_line of the open file with replacement_text; the
  indentation must be right, a wrong edit is shown back to you for a retry
submit
  submits your change and ends the session

RESPONSE FORMAT:
Every reply starts with a DISCUSSION paragraph explaining what you do next and why, followed by
exactly one command. Wait for the command's output before the next one. Interactive programs
(vim, python REPL, git log without -n) are not supported.

IMPORTANT TIPS:
1. Reproduce the bug first; write a small test or main class if the issue has none.
2. When a command fails, try a different command, not the same one again.
3. Use goto to jump to a line instead of scrolling a hundred lines at a time.
4. Always check the file after an edit: a wrong indentation breaks Java builds too.
5. The shell's working directory persists between commands; `open` takes paths relative to it.
6. Remove reproduction files before you submit.
"""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one interface command (open, goto, scroll_up/down, create, edit <start>:<end> ... end_of_edit, search_dir, search_file, find_file, submit) or any shell command in the task repository. Returns the command output followed by the open file and current directory.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command to run."}}, "required": ["command"]},
        },
    }
]

# (repository, package, key class, exception, issue title, steps, second user message?)
PROJECTS = [
    ("tidewater/ledgerd", "io.tidewater.ledger", "JournalWriter", "java.lang.IllegalStateException", "JournalWriter loses the last entry when the batch is exactly full", 10, False),
    ("quillmark/quill-json", "org.quillmark.json", "ObjectReader", "java.lang.NullPointerException", "ObjectReader fails on empty arrays of records with a NullPointerException", 14, False),
    ("harborlight/relay", "net.harborlight.relay", "RouteTable", "java.util.ConcurrentModificationException", "RouteTable.reload throws ConcurrentModificationException under load", 18, True),
    ("fernbank/cronkit", "dev.fernbank.cronkit", "ScheduleParser", "java.time.DateTimeException", "ScheduleParser rejects '0 0 29 2 *' (Feb 29) as invalid", 24, False),
    ("mossgate/blobstore", "com.mossgate.blob", "ChunkUploader", "java.io.UncheckedIOException", "ChunkUploader retries forever on HTTP 413 from the storage gateway", 34, True),
    ("larkspur/metrics-bridge", "org.larkspur.metrics", "HistogramExporter", "java.lang.ArithmeticException", "HistogramExporter divides by zero when a bucket has no samples", 64, True),
]

_VERBS = ("read", "write", "flush", "resolve", "parse", "merge", "apply", "build", "load", "close", "emit", "track", "check", "split", "encode")
_NOUNS = ("Entry", "Batch", "Buffer", "Header", "Route", "Record", "Chunk", "Bucket", "Schedule", "Token", "Window", "Segment", "Config", "Sample", "Offset")
_TYPES = ("int", "long", "String", "boolean", "List<String>", "Map<String, Long>", "Optional<Entry>", "byte[]", "Duration")
_SUBDIRS = ("core", "io", "util", "config", "internal", "api", "metrics", "codec")

_PROSE = (
    "The behaviour described in the issue matches what the code does here: the method returns before the last element is handled.",
    "This looks like the place where the state is updated, so a fix should go here rather than in the caller.",
    "I want to see how the method is used elsewhere before changing its contract.",
    "The test output confirms the bug is reproduced, which gives us a way to check the fix.",
    "The build output is long, but the relevant part is the failing test and its stack trace.",
    "Let's look at the surrounding code to understand the invariants the class relies on.",
    "Before editing, I'll check whether other classes depend on this behaviour.",
    "The edit looks correct and the indentation is consistent with the rest of the file.",
)


class Repo:
    """An invented Java repository: files with deterministic content."""

    def __init__(self, name: str, package: str, key: str, rng: random.Random) -> None:
        self.name = name
        self.root = "/" + name.replace("/", "__")
        self.package = package
        self.key = key
        self.rng = rng
        base = "src/main/java/" + package.replace(".", "/")
        self.files: dict[str, int] = {}
        for sub in _SUBDIRS:
            for _ in range(rng.randint(3, 7)):
                cls = rng.choice(_NOUNS) + rng.choice(("Reader", "Writer", "Factory", "Handler", "Codec", "Registry", "Support", "Util"))
                self.files[f"{base}/{sub}/{cls}.java"] = rng.randint(120, 900)
        self.key_path = f"{base}/core/{key}.java"
        self.files[self.key_path] = rng.randint(400, 700)
        self.test_path = f"src/test/java/{package.replace('.', '/')}/core/{key}Test.java"
        self.files[self.test_path] = rng.randint(150, 300)

    def cls(self, path: str) -> str:
        return path.rsplit("/", 1)[-1].removesuffix(".java")

    def line(self, path: str, n: int) -> str:
        """Line ``n`` of ``path``: the same text every time it is shown."""
        r = random.Random(f"{path}:{n}")
        if n == 1:
            return f"package {self.package};"
        if n < 12:
            return "" if n in (2, 10) else f"import {self.package}.{r.choice(_SUBDIRS)}.{r.choice(_NOUNS)};" if n < 8 else f"import java.util.{r.choice(('List', 'Map', 'Optional', 'Objects', 'ArrayList'))};"
        if n == 12:
            return f"public class {self.cls(path)} {{"
        k = n % 9
        verb, noun, typ = r.choice(_VERBS), r.choice(_NOUNS), r.choice(_TYPES)
        if k == 0:
            return f"    public {typ} {verb}{noun}({r.choice(_TYPES)} {noun.lower()}) {{"
        if k == 1:
            return f"        Objects.requireNonNull({noun.lower()}, \"{noun.lower()} must not be null\");"
        if k == 2:
            return f"        if ({noun.lower()}Count >= {r.choice(('capacity', 'limit', 'maxSize', 'buckets.length'))}) {{"
        if k == 3:
            return f"            {r.choice(('flush', 'reset', 'grow', 'rotate'))}{noun}(); // see {self.cls(path)}#{verb}{noun}"
        if k == 4:
            return "        }"
        if k == 5:
            return f"        {r.choice(_TYPES).split('<')[0]} {verb}ed = this.{noun.lower()}s.get({r.randint(0, 9)});"
        if k == 6:
            return f"        return {verb}ed == null ? {r.choice(('null', 'Optional.empty()', '0L', 'List.of()'))} : {verb}ed;"
        if k == 7:
            return "    }"
        return "" if r.random() < 0.5 else f"    // {r.choice(_PROSE)[:70]}"

    def window(self, path: str, first: int) -> str:
        total = self.files[path]
        first = max(1, min(first, total - 99))
        last = min(total, first + 99)
        out = [f"[File: {self.root}/{path} ({total} lines total)]"]
        if first > 1:
            out.append(f"({first - 1} more lines above)")
        out += [f"{i}:{self.line(path, i)}" for i in range(first, last + 1)]
        if last < total:
            out.append(f"({total - last} more lines below)")
        return "\n".join(out)

    def listing(self) -> str:
        dirs: dict[str, list[str]] = {}
        for p in sorted(self.files):
            d, f = p.rsplit("/", 1)
            dirs.setdefault(d, []).append(f)
        out = []
        for d, fs in dirs.items():
            out.append(f"./{d}:")
            out += fs
            out.append("")
        return "\n".join(out)


class Builder:
    def __init__(self, project: tuple[str, str, str, str, str, int, bool], index: int) -> None:
        name, package, key, exc, title, steps, second = project
        self.rng = random.Random(index * 7919 + 17)
        self.repo = Repo(name, package, key, self.rng)
        self.exc, self.title, self.steps, self.second = exc, title, steps, second
        self.task = name.replace("/", "__") + f"-{100 + index * 37}"
        self.id = f"synthetic-swe/{self.task}"
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.issue()}]
        self.open_file: str | None = None
        self.n = 0

    def issue(self) -> str:
        r = self.repo
        trace = self.trace(3)
        return (
            f"We're currently solving the following issue within our repository. Here's the issue text:\nISSUE:\n{self.title}\n"
            f"**Version**: {r.name.split('/')[1]} 2.{self.rng.randint(1, 9)}.{self.rng.randint(0, 12)}, OpenJDK 17.0.{self.rng.randint(2, 9)}\n\n"
            f"**Description**\nCalling `{r.key}` from our service fails as below. It started after upgrading; the previous minor version was fine.\n\n"
            f"```\n{trace}\n```\n\nSee also https://github.com/{r.name}/issues/{self.rng.randint(200, 900)} and the docs at https://{r.name.split('/')[1]}.example.org/docs/{r.key.lower()}.html\n\n"
            "INSTRUCTIONS:\nNow, you're going to solve this issue on your own. Edit the repository's files with the interface "
            "commands, write a reproduction if you need one, and run `submit` when you are done. You cannot use interactive "
            "session commands (vim, git log without -n) in this environment.\n\n"
            f"(Open file: n/a)\n(Current directory: {r.root})\nbash-$"
        )

    def trace(self, depth: int) -> str:
        r = self.repo
        frames = [f"\tat {r.package}.core.{r.key}.{self.rng.choice(_VERBS)}{self.rng.choice(_NOUNS)}({r.key}.java:{self.rng.randint(40, 400)})"]
        for p in self.rng.sample(sorted(r.files), depth):
            c = r.cls(p)
            frames.append(f"\tat {r.package}.{p.split('/')[-2]}.{c}.{self.rng.choice(_VERBS)}{self.rng.choice(_NOUNS)}({c}.java:{self.rng.randint(20, 300)})")
        return f"Exception in thread \"main\" {self.exc}: {self.rng.choice(_NOUNS).lower()} index {self.rng.randint(1, 64)} out of range\n" + "\n".join(frames)

    def footer(self) -> str:
        shown = f"{self.repo.root}/{self.open_file}" if self.open_file else "n/a"
        return f"\n(Open file: {shown})\n(Current directory: {self.repo.root})\nbash-$"

    def step(self, thought: str, command: str, output: str) -> None:
        self.n += 1
        cid = f"call_synthetic_{self.task}_{self.n}"
        self.messages.append({"role": "assistant", "content": "DISCUSSION\n" + thought, "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]})
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": output + self.footer()})

    def prose(self) -> str:
        return " ".join(self.rng.sample(_PROSE, 2))

    def mvn(self, failing: bool) -> str:
        r = self.repo
        lines = ["[INFO] Scanning for projects...", f"[INFO] Building {r.name.split('/')[1]} 2.x-SNAPSHOT", "[INFO] --- maven-compiler-plugin:3.11.0:compile (default-compile) ---"]
        lines += [f"[INFO] Compiling {len(r.files)} source files to {r.root}/target/classes"]
        lines += [f"[WARNING] {r.root}/{p}:[{self.rng.randint(10, 99)},{self.rng.randint(5, 40)}] deprecated API used" for p in self.rng.sample(sorted(r.files), 4)]
        lines += ["[INFO] --- maven-surefire-plugin:3.1.2:test (default-test) ---", "[INFO] -------------------------------------------------------", "[INFO]  T E S T S", "[INFO] -------------------------------------------------------"]
        for p in sorted(r.files)[:: max(1, len(r.files) // 12)]:
            lines.append(f"[INFO] Running {r.package}.{p.split('/')[-2]}.{r.cls(p)}Test")
            lines.append(f"[INFO] Tests run: {self.rng.randint(3, 40)}, Failures: 0, Errors: 0, Skipped: 0, Time elapsed: 0.{self.rng.randint(10, 99)} s")
        if failing:
            lines += [f"[ERROR] Tests run: 12, Failures: 1, Errors: 0, Skipped: 0 <<< FAILURE! - in {r.package}.core.{r.key}Test",
                      f"[ERROR] {r.package}.core.{r.key}Test.testIssueReproduction  Time elapsed: 0.02 s  <<< FAILURE!", self.trace(4),
                      "[ERROR] BUILD FAILURE", f"[ERROR] Failed to execute goal org.apache.maven.plugins:maven-surefire-plugin:3.1.2:test on project {r.name.split('/')[1]}"]
        else:
            lines += ["[INFO] Tests run: 412, Failures: 0, Errors: 0, Skipped: 3", "[INFO] BUILD SUCCESS"]
        return "\n".join(lines)

    def debug_log(self) -> str:
        """A giant output (about 12K tokens): Maven's debug log, every class path entry and
        source file of the module listed, as agents meet them and windows cannot hold them."""
        r = self.repo
        lines = ["Apache Maven 3.9.5, Java version: 17.0.8, vendor: Eclipse Adoptium, runtime: /opt/java/openjdk", "[DEBUG] Created new class realm maven.api"]
        for i in range(260):
            group = self.rng.choice(("org.apache.maven", "com.fasterxml.jackson.core", "org.junit.jupiter", "org.slf4j", "io.netty", "com.google.guava"))
            art = self.rng.choice(("core", "api", "impl", "engine", "commons", "buffer", "codec"))
            lines.append(f"[DEBUG]   Imported: {group}.{art} < plugin>{group}:{art}-{i % 17}:{1 + i % 5}.{i % 13}.{i % 7}")
            if i % 4 == 0:
                p = self.rng.choice(sorted(r.files))
                lines.append(f"[DEBUG] Stale source detected: {r.root}/{p} (target/classes/{p.split('/java/', 1)[-1].replace('.java', '.class')})")
        lines.append("[INFO] BUILD SUCCESS")
        return "\n".join(lines)

    def build(self) -> dict[str, Any]:
        r = self.repo
        paths = sorted(r.files)
        self.step("First I'll look at the layout of the repository to find the classes the issue mentions.", "ls -R src", r.listing())
        self.step(f"The issue is about `{r.key}`. Let's find its source file.", f"find_file \"{r.key}.java\"", f"Found 1 matches for \"{r.key}.java\" in {r.root}:\n{r.root}/{r.key_path}")
        self.open_file = r.key_path
        self.step(f"Let's open `{r.key}.java` and read the code around the failing method.", f"open {r.key_path}", r.window(r.key_path, 1))
        self.step("Before changing anything I'll reproduce the failure with the test suite.", "mvn -q test", self.mvn(True))
        middle = self.steps - 6
        for k in range(middle):
            if self.second and k == middle // 2:
                self.messages.append({"role": "user", "content": f"One more thing: please keep `{r.key}`'s public method signatures unchanged, other teams compile against them, and add the reproduction as a unit test in {r.test_path} rather than a main class. The CI log is at https://ci.{r.name.split('/')[1]}.example.org/job/{self.rng.randint(1000, 9999)}/console"})
            kind = k % 6
            if self.steps >= 30 and k == middle // 3:
                self.step("The failure may depend on the build's configuration. Let's see Maven's debug output for the module.", f"mvn -X test -Dtest={r.key}Test", self.debug_log())
            elif kind == 0:
                term = self.rng.choice(_VERBS) + self.rng.choice(_NOUNS)
                hits = self.rng.sample(paths, self.rng.randint(2, 6))
                out = f"Found {len(hits) * 2} matches for \"{term}\" in {r.root}/src:\n" + "\n".join(f"{r.root}/{p} (2 matches)" for p in hits) + f"\nEnd of matches for \"{term}\" in {r.root}/src"
                self.step(f"{self.prose()} Let's search for `{term}`.", f"search_dir \"{term}\" src", out)
            elif kind in (1, 3):
                p = self.rng.choice(paths)
                self.open_file = p
                self.step(f"{self.prose()} Opening `{r.cls(p)}`.", f"open {p} {self.rng.randint(1, r.files[p])}", r.window(p, self.rng.randint(1, r.files[p])))
            elif kind == 2:
                p = self.open_file or r.key_path
                first = self.rng.randint(1, r.files[p])
                self.step(f"{self.prose()} Let's go further down.", f"goto {first}", r.window(p, first))
            elif kind == 4:
                p = self.open_file or r.key_path
                first = self.rng.randint(13, r.files[p] - 5)
                new = [f"    {r.line(p, first + i).strip()}  // adjusted" for i in range(3)]
                self.step(f"{self.prose()} I'll edit lines {first}-{first + 2}.", f"edit {first}:{first + 2}\n" + "\n".join(new) + "\nend_of_edit", r.window(p, first - 20) + "\nFile updated. Please review the changes and make sure they are correct (correct indentation, no duplicate lines, etc). Edit the file again if necessary.")
            else:
                self.step(f"{self.prose()} Running the tests of the module again.", f"mvn -q test -Dtest={r.key}Test", self.mvn(self.rng.random() < 0.6))
        self.open_file = r.test_path
        self.step("Adding the reproduction as a unit test.", f"open {r.test_path} {r.files[r.test_path] - 30}", r.window(r.test_path, r.files[r.test_path] - 30))
        self.step("Running the whole build to make sure nothing else broke.", "mvn -q test", self.mvn(False))
        diff = "\n".join(f"diff --git a/{p} b/{p}\n--- a/{p}\n+++ b/{p}\n@@ -{n},3 +{n},3 @@\n-{r.line(p, n)}\n+{r.line(p, n)}  // adjusted\n {r.line(p, n + 1)}" for p, n in ((r.key_path, 120), (r.test_path, 40)))
        self.step(f"The build passes and the reproduction test is green. The fix in `{r.key}` is complete, so I'll submit.", "submit", diff)
        return {
            "id": self.id,
            "source": SOURCE,
            "messages": self.messages,
            "tools": TOOLS,
            "meta": {"agent": "SWE-agent 0.x style (synthetic)", "license": "MIT (part of ctxengine)", "task": self.task, "repo": r.name, "issue": self.title},
        }


def build() -> list[dict[str, Any]]:
    return [Builder(p, i).build() for i, p in enumerate(PROJECTS)]


def render() -> str:
    return "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in build())


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stdout.write(render())
        return 0
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
