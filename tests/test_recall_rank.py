"""ctx_grep ranked for an agent: what the query names first, repeats counted, whole lines, a
bounded answer; and the bench's realistic queries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ctxengine.bench.probe import agent_queries, probe_recall, realistic_query
from ctxengine.messages import Message
from ctxengine.recall import GREP_MAX_CHARS, GREP_TOOL, Recall
from ctxengine.store.sqlite import SqliteStore

FULL = "/repo/core/src/main/java/com/acme/registry/RegistryAuthenticator.java"


def _call(i: int, command: str) -> Message:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}],
    }


def _history() -> list[Message]:
    msgs: list[Message] = [{"role": "user", "content": "Fix the login bug in the registry client"}]
    msgs.append(_call(1, 'find_file "RegistryAuthenticator.java"'))
    msgs.append({"role": "tool", "tool_call_id": "c1", "content": f'Found 1 matches for "RegistryAuthenticator.java":\n{FULL}'})
    for i in range(2, 30):
        # listings and grep output mention the bare name many times, never the full path
        msgs.append(_call(i, f"grep -rn Authenticator src {i}"))
        listing = "\n".join(["RegistryAuthenticator.java", "RegistryAuthenticatorTest.java", f"noise line {i}"] * 3)
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": listing})
    msgs.append(_call(40, "mvn -q test"))
    msgs.append({"role": "tool", "tool_call_id": "c40", "content": "[ERROR] Tests run: 3, Failures: 1\n" + "x " * 400 + "\njava.lang.IllegalStateException: realm missing in https://registry.example.com/v2/token/realm-check header"})
    return msgs


@pytest.fixture
def recall() -> Iterator[Recall]:
    store = SqliteStore(":memory:")
    store.record_messages("s", _history())
    yield Recall(store, "s")
    store.close()


def _grep(recall: Recall, **args: Any) -> dict[str, Any]:
    return dict(json.loads(recall.handle(GREP_TOOL, args)))


def test_a_file_name_brings_its_full_path_first(recall: Recall) -> None:
    answer = _grep(recall, query="RegistryAuthenticator.java")
    first = answer["results"][0]
    assert first["type"] == "paths" and FULL in first["snippet"].split("\n")


def test_identical_lines_are_one_result_with_their_count(recall: Recall) -> None:
    answer = _grep(recall, query="RegistryAuthenticatorTest.java", limit=50)
    bare = [r for r in answer["results"] if r.get("snippet") == "RegistryAuthenticatorTest.java"]
    assert len(bare) == 1 and bare[0]["n"] == 28 * 3


def test_an_error_class_brings_the_error_line_whole(recall: Recall) -> None:
    answer = _grep(recall, query="IllegalStateException")
    top = answer["results"][:2]
    assert any("java.lang.IllegalStateException: realm missing in https://registry.example.com/v2/token/realm-check header" in r["snippet"] for r in top)


def test_part_of_a_url_brings_the_url(recall: Recall) -> None:
    answer = _grep(recall, query="realm-check")
    assert answer["results"][0]["type"] == "urls"
    assert "https://registry.example.com/v2/token/realm-check" in answer["results"][0]["snippet"]


def test_the_first_words_of_a_command_bring_the_command_line(recall: Recall) -> None:
    answer = _grep(recall, query='find_file "Registry')
    assert answer["results"][0]["snippet"] == 'bash: find_file "RegistryAuthenticator.java"'


def test_answers_are_bounded_and_say_how_to_get_more(recall: Recall) -> None:
    assert len(recall.handle(GREP_TOOL, {"query": "Authenticator", "limit": 50})) <= GREP_MAX_CHARS
    data = _grep(recall, query="noise", limit=5)
    assert data["more"] == 28 - 5 and data["next_offset"] == data["count"] == 5
    page2 = _grep(recall, query="noise", limit=5, offset=5)
    seen = {r["snippet"] for r in data["results"]}
    assert page2["results"] and not seen & {r["snippet"] for r in page2["results"]}


def test_long_lines_are_cut_at_whitespace_only() -> None:
    store = SqliteStore(":memory:")
    url = "https://example.com/a/very/long/path/segment/file-name.tar.gz"
    line = "warning: " + "word " * 200 + url + " " + "tail " * 100
    store.record_messages("s", [{"role": "user", "content": "go"}, {"role": "assistant", "content": line}])
    answer = _grep(Recall(store, "s"), query="file-name")
    assert any(url in r["snippet"] for r in answer["results"])
    shown = next(r["snippet"] for r in answer["results"] if r["type"] == "line")
    assert url in shown and len(shown) < len(line)
    store.close()


def test_realistic_queries_are_what_an_agent_types() -> None:
    assert realistic_query("paths", "src/app/Foo.java") == "Foo.java"
    assert realistic_query("paths", "/r/dubbo-api/src/main/java") == "dubbo-api/src/main/java"
    assert realistic_query("urls", "https://github.com/o/r/issues/12?x=1") == "12"
    assert realistic_query("urls", "https://example.com") == "example.com"
    assert realistic_query("errors", "Caused by: java.io.IOException: closed") == "IOException"
    assert realistic_query("errors", "[ERROR] /x/Foo.java:[10,20] cannot find symbol") == "cannot find symbol"
    assert realistic_query("calls", "bash: open src/Foo.java 120") == "open src/Foo.java"
    assert realistic_query("users", "Please fix the failing test in Foo now") == "Please fix the failing test"


def test_the_probe_counts_a_fact_found_in_the_first_five_results(recall: Recall) -> None:
    def grep(q: str) -> str:
        return recall.handle(GREP_TOOL, {"query": q})

    removed = {"paths": [FULL], "calls": ['bash: find_file "RegistryAuthenticator.java"'], "errors": ["never/seen: NoSuchThingError"]}
    total, found, misses = probe_recall(grep, removed)
    assert total == {"paths": 1, "calls": 1, "errors": 1}
    assert found == {"paths": 1, "calls": 1}
    assert misses["errors"][0]["query"] == "NoSuchThingError"


def test_the_identifier_index_is_built_once_and_answers_from_the_store() -> None:
    store = SqliteStore(":memory:")
    store.record_messages("s", _history())
    recall = Recall(store, "s")
    assert recall.index_identifiers() > 0
    assert recall.index_identifiers() == 0  # nothing new since
    with store._read() as cur:
        kinds = {str(k) for (k,) in store._all(cur, "SELECT DISTINCT kind FROM recall_idents")}
    assert {"path", "url", "error", "command"} <= kinds
    found = store.recall_candidates(["RegistryAuthenticator.java"], session_id="s")
    assert found is not None and any(FULL in text for _, _, _, text in found)
    assert store.recall_candidates(["ab"], session_id="s") is None  # too short for trigrams: scan
    store.append_messages("s", [{"role": "user", "content": "see /new/place/Late.java"}])
    assert _grep(recall, query="Late.java")["results"][0]["snippet"] == "/new/place/Late.java"
    store.close()


def test_the_probe_narrows_a_shared_file_name_as_an_agent_would() -> None:
    """Seven paths ending with the same file name: the name alone cannot put each in the first
    five results; an agent after one of them types its distinguishing tail. The bare name's
    share is reported beside it."""
    listing = [f"/sys/devices/tty/ttyS{k}/power/runtime_status" for k in range(7)]
    unique = "/srv/app/handlers/payment_gateway.py"

    def grep(q: str) -> str:  # an ideal search: every removed line that holds the query, in order
        hits = [line for line in [*listing, unique] if q in line]
        return json.dumps({"results": [{"text": h} for h in hits]})

    distinct: dict[str, list[int]] = {}
    plain: dict[str, list[int]] = {}
    total, found, _misses = probe_recall(grep, {"paths": [*listing, unique]}, distinct=distinct, plain=plain)
    assert total == {"paths": 8} and found == {"paths": 8}
    assert distinct == {"paths": [8, 8]}
    assert plain == {"paths": [8, 6]}  # by the name alone the 6th and 7th listing paths miss


def test_agent_queries_name_what_singles_a_fact_out() -> None:
    paths = [f"/sys/x/ttyS{k}/power/uevent" for k in range(7)] + ["/a/b/Foo.java"]
    q = agent_queries("paths", paths)
    assert q["/sys/x/ttyS5/power/uevent"] == "ttyS5/power/uevent"
    assert q["/a/b/Foo.java"] == "Foo.java"
    errors = ["public abstract int getTextLength() throws JacksonException;", "Caused by: java.io.IOException: closed"]
    qe = agent_queries("errors", errors)
    assert qe[errors[0]] == "getTextLength(" and qe[errors[1]] == "IOException"
    preamble = "We're currently solving the following issue within our repository."
    users = [f"{preamble}\nISSUE:\nTitle number {k} is broken  badly here" for k in range(3)]
    qu = agent_queries("users", users)
    assert qu[users[1]] == "Title number 1 is broken" and all(qu[u] in u for u in users)


def test_a_long_listing_says_how_to_name_the_paths_it_could_not_show() -> None:
    names = ["uevent", "runtime_status", "control"]
    listing = "\n".join(f"/sys/devices/serial8250/tty/ttyS{k}/power/{n}" for k in range(120) for n in names)
    store = SqliteStore(":memory:")
    store.record_messages("s", [{"role": "user", "content": "list it"}, {"role": "assistant", "content": listing}])
    answer = _grep(Recall(store, "s"), query="runtime_status")
    first = answer["results"][0]
    assert first["type"] == "paths" and first["more_items"] > 0
    shown = first["snippet"].splitlines()
    hidden = first["more_items"]
    assert len(shown) + hidden == 120
    assert first["narrow"].startswith(f"{hidden} more end with /power/runtime_status under: ttyS")
    assert 'e.g. ctx_grep "ttyS' in first["narrow"]
    assert len(json.dumps(answer)) <= GREP_MAX_CHARS
    store.close()
