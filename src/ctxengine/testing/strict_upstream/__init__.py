"""A strict, scripted LLM upstream on 127.0.0.1 that plays an agent task and rejects what a
provider rejects, for benchmarks and tests that drive real clients through ``ctxengine proxy``.

It speaks ``POST /v1/chat/completions``, ``POST /v1/messages`` (and ``/v1/messages/count_tokens``)
and ``POST /v1/responses``, streamed (the real SSE event sequences) or not, and logs every
request (path, headers, body, status, the reason of a rejection) to a JSON Lines file.

The task (:class:`Task`): read ``part01.txt`` … ``partNN.txt`` in a work folder, one per step,
with the **client's own tools** (a read tool such as ``Read``/``read_file``, else a shell tool
such as ``Bash``/``shell``/``exec_command``, chosen from the tools the request declares), then
answer ``TASK DONE`` with every file's code. Each file is ~3K tokens, so a 16K–40K window needs
compaction. The step is read from the *last* tool result (the highest ``MARKER partNN`` in it),
so it survives a proxy that dropped the earlier turns. Once the ``ctx_grep`` recall tool is
offered (the proxy adds it after a compaction) the script calls it once for ``part01``'s code
before finishing, and counts the answer when it holds the code. A request without tools whose
conversation holds the task gets plain-text replies that ask for the next file by name (aider
adds a file named in a reply to its chat).

Rejections, each in the provider's 400 shape:

* a tool call without its result, or a result without its call (chat, messages, responses);
* a thinking block whose signature is not the one this server issued for it, byte for byte;
* a Responses ``function_call_output`` without its ``function_call``, a reasoning item altered,
  or a ``function_call`` this server issued after a reasoning item sent without that item;
* a request over the window, counted with o200k over system, messages and tool definitions:
  every string in the system prompt/instructions and messages/input (ids, signatures and
  encrypted reasoning left out), 3 tokens a message, and the tool list as compact JSON with
  non-ASCII kept, as ctxengine's window counts it (OpenAI: ``context_length_exceeded`` "This
  model's maximum context length is N tokens…"; Responses: the same code; Anthropic: ``prompt
  is too long: N tokens > M maximum``).

Usage::

    with StrictUpstream(Task(root, steps=12), window=32_000, log_path=path) as up:
        ...  # point the proxy's upstream base URLs at up.openai_base_url / up.anthropic_base_url

The package, by concern: :mod:`.task` (the files and the reply), :mod:`.script` (which of the
client's tools reads the next file, how to read the conversation), :mod:`.server` (lifecycle,
signing, log, the script's decisions), :mod:`.validate` (what each provider rejects),
:mod:`.tokens` (the window count), :mod:`.handler` (the one request flow), :mod:`.chat`,
:mod:`.messages`, :mod:`.responses` (each API's checks, 400 body, reply and SSE events),
:mod:`.wire` (SSE and the error shapes) and :mod:`.stats`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from .script import RECALL_TOOL as RECALL_TOOL  # importable from here, as before the split
from .script import pick_tool_call as pick_tool_call
from .server import StrictUpstream
from .task import Reply, Task
from .tokens import count_request_tokens

__all__ = ["Reply", "StrictUpstream", "Task", "count_request_tokens"]


def main(argv: list[str] | None = None) -> None:
    """``python -m ctxengine.testing.strict_upstream --port 9000 --log requests.jsonl DIR``."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m ctxengine.testing.strict_upstream",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("root", type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--window", type=int, default=32_000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--log", type=Path)
    a = p.parse_args(argv)
    task = Task(a.root, steps=a.steps)
    task.write()
    up = StrictUpstream(task, window=a.window, log_path=a.log, port=a.port).start()
    print(
        f"listening on {up.openai_base_url} / {up.anthropic_base_url}; task: {task.prompt}",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)
