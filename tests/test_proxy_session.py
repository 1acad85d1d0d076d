"""Which session a request belongs to: the ids clients send, and conversations told apart by
their histories (what real clients send: DESIGN 3.12)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.proxy.session import (
    SESSION_HEADER,
    SessionIdError,
    SessionKey,
    SessionRouter,
    client_session_id,
    derive_session_id,
    message_digest,
    names_one_conversation,
    routed,
    sample_positions,
    session_for,
    session_key,
    system_prompt_digest,
)

VALID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
UUID_A = "4b4a2c0e-8a8f-4f7e-9a51-2a3b1c0d9e8f"
UUID_B = "0e1d2c3b-4a59-4687-a9b8-c7d6e5f40312"


# -- the ids clients send ---------------------------------------------------------------------


def test_the_session_header_wins_and_is_checked() -> None:
    body = {"metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": UUID_A})}}
    assert client_session_id("anthropic", {SESSION_HEADER: "my-task", "x-claude-code-session-id": UUID_B}, body) == "my-task"
    with pytest.raises(SessionIdError):
        client_session_id("openai", {SESSION_HEADER: "bad id!"}, {})


def test_claude_code_is_known_by_its_header_and_both_metadata_formats() -> None:
    new = {"metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": UUID_A})}}
    legacy = {"metadata": {"user_id": f"user_{'a' * 64}_account_{UUID_B}_session_{UUID_A}"}}
    legacy_no_account = {"metadata": {"user_id": f"user_{'a' * 64}_account__session_{UUID_A}"}}
    assert client_session_id("anthropic", {}, new) == f"cc:{UUID_A}"
    assert client_session_id("anthropic", {}, legacy) == f"cc:{UUID_A}"
    assert client_session_id("anthropic", {}, legacy_no_account) == f"cc:{UUID_A}"
    assert client_session_id("anthropic", {}, {"metadata": {"user_id": {"session_id": UUID_A}}}) == f"cc:{UUID_A}"
    assert client_session_id("anthropic", {"x-claude-code-session-id": UUID_A}, {}) == f"cc:{UUID_A}"
    # two `claude -p` runs with the same prompt carry two session ids: two sessions
    other = {"metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": UUID_B})}}
    assert client_session_id("anthropic", {}, other) != client_session_id("anthropic", {}, new)


def test_an_end_users_id_is_not_a_conversation() -> None:
    # OpenAI's ``user`` / ``safety_identifier`` and an app's own metadata.user_id name a person,
    # the same for all of their conversations
    for body in ({"user": "alice"}, {"user": UUID_A}, {"safety_identifier": UUID_A}, {"metadata": {"user_id": "alice"}}, {"metadata": {"user_id": "{not json"}}):
        assert client_session_id("openai", {}, body) is None
    assert client_session_id("anthropic", {}, {"metadata": {"user_id": json.dumps({"device_id": "x"})}}) is None


def test_codex_and_the_responses_api_are_known_by_their_ids() -> None:
    assert client_session_id("responses", {"session-id": UUID_A, "thread-id": UUID_A}, {"prompt_cache_key": UUID_A}) == f"codex:{UUID_A}"
    assert client_session_id("responses", {"session_id": UUID_A, "conversation_id": UUID_A}, {}) == f"codex:{UUID_A}"
    assert client_session_id("responses", {"thread-id": UUID_A}, {}) == f"codex:{UUID_A}"
    # a sub-agent has a history of its own
    assert client_session_id("responses", {"session-id": UUID_A, "x-openai-subagent": "review"}, {}) == f"codex:{UUID_A}:review"
    assert client_session_id("responses", {}, {"prompt_cache_key": UUID_A}) == f"pck:{UUID_A}"
    assert client_session_id("responses", {}, {"conversation": "conv_123"}) == "conv:conv_123"
    assert client_session_id("responses", {}, {"conversation": {"id": "conv_123"}}) == "conv:conv_123"
    assert client_session_id("openai", {}, {"model": "m", "messages": []}) is None


def test_opencode_and_qwen_code_are_known_by_their_ids() -> None:
    # opencode: its session id in x-session-id on every request, whatever the API
    for api in ("openai", "anthropic", "responses", "gemini"):
        assert client_session_id(api, {"x-session-id": "ses_4f2a9c1e7b3dffe0"}, {}) == "sid:ses_4f2a9c1e7b3dffe0"
    # Qwen Code's DashScope provider: metadata.sessionId (its promptId changes every turn: not the id)
    body = {"model": "qwen3-coder-plus", "messages": [], "metadata": {"sessionId": UUID_A, "promptId": "p-1"}}
    assert client_session_id("openai", {}, body) == f"qwen:{UUID_A}"
    assert client_session_id("openai", {}, {**body, "metadata": {"sessionId": "", "promptId": "p"}}) is None
    # a client that names its conversation keeps an edited turn in it, as Claude Code does
    assert names_one_conversation("sid:ses_1") and names_one_conversation(f"qwen:{UUID_A}") and routed("sid:ses_1")
    # Claude Code's and Codex's own ids come first; the user's name before everything
    assert client_session_id("anthropic", {"x-claude-code-session-id": UUID_B, "x-session-id": "ses_1"}, {}) == f"cc:{UUID_B}"
    assert client_session_id("openai", {SESSION_HEADER: "mine", "x-session-id": "ses_1"}, {}) == "mine"


@given(st.text(min_size=1, max_size=300))
def test_a_client_id_becomes_a_valid_store_id_and_two_ids_never_become_one(raw: str) -> None:
    sid = client_session_id("openai", {}, {"prompt_cache_key": raw})
    assert sid is not None and VALID.fullmatch(sid) and sid.startswith("pck:")
    other = client_session_id("openai", {}, {"prompt_cache_key": raw + "x"})
    assert other != sid
    assert routed(sid)


def test_names_are_not_routed_and_every_other_id_is() -> None:
    assert not routed("my-task")
    assert routed(derive_session_id("openai", {}, None, [{"role": "user", "content": "x"}]))
    for sid in (f"cc:{UUID_A}", f"codex:{UUID_A}", "pck:k", "conv:c"):
        assert routed(sid)
    # a client's conversation id keeps an edited turn; a derived id or a cache key (maybe one
    # per user) does not
    assert names_one_conversation(f"cc:{UUID_A}") and names_one_conversation(f"codex:{UUID_A}:review")
    assert not names_one_conversation("pck:k") and not names_one_conversation("px-0123") and not names_one_conversation("my-task")


# -- conversations told apart by their histories ----------------------------------------------

SYSTEM = {"role": "system", "content": "Act as an expert software developer."}
EXAMPLE = [
    {"role": "user", "content": "Change the greeting to be more casual"},
    {"role": "assistant", "content": "Ok, I will:\n\nshow_greeting.py\n```\nprint('hey')\n```"},
    {"role": "user", "content": "I switched to a new code base. Please don't consider the above files."},
    {"role": "assistant", "content": "Ok."},
]


def aider_chat(tag: str, turns: int) -> list[list[dict[str, Any]]]:
    """What aider sends turn after turn: the system prompt, its example exchange, the files in
    the chat, the user's requests, and a reminder system message at the very end."""
    history: list[dict[str, Any]] = [SYSTEM, *EXAMPLE, {"role": "user", "content": "I have *added these files to the chat*: app.py"}, {"role": "assistant", "content": "Ok."}]
    out = []
    for k in range(turns):
        history = [*history, {"role": "user", "content": f"{tag}: request {k}"}]
        out.append(json.loads(json.dumps([*history, {"role": "system", "content": "Reply with whole files."}])))
        history = [*history, {"role": "assistant", "content": f"{tag}: answer {k}"}]
    return out


def key_of(messages: list[dict[str, Any]]) -> str:
    return derive_session_id("openai", {"authorization": "Bearer k"}, None, messages)


def test_one_chat_resent_each_turn_is_one_session() -> None:
    router = SessionRouter()
    chat = aider_chat("a", 12)
    before = json.loads(json.dumps(chat))
    ids = {router.route(key_of(req), req) for req in chat}
    assert chat == before  # read, never changed
    assert ids == {key_of(aider_chat("a", 1)[0])}  # the derived id itself: as before the router


def test_two_interleaved_chats_with_the_same_opening_are_two_sessions() -> None:
    router = SessionRouter()
    a, b = aider_chat("a", 10), aider_chat("b", 10)
    key = key_of(a[0])
    assert key == key_of(b[0])  # the derived key cannot tell them apart
    ids_a, ids_b = [], []
    for ra, rb in zip(a, b, strict=True):
        ids_a.append(router.route(key, ra))
        ids_b.append(router.route(key, rb))
    assert len(set(ids_a)) == 1 and len(set(ids_b)) == 1 and ids_a[0] != ids_b[0]
    assert ids_a[0] == key and ids_b[0].startswith(key + ".") and VALID.fullmatch(ids_b[0])


def test_the_same_opening_run_twice_splits_once_the_runs_differ() -> None:
    # two runs of one prompt without ids: their first requests are the same request
    router = SessionRouter()
    first = [{"role": "user", "content": "fix the build"}]
    key = key_of(first)
    run_a = [first, [*first, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "go on"}]]
    run_b = [first, [*first, {"role": "assistant", "content": "B1"}, {"role": "user", "content": "go on"}]]
    assert router.route(key, run_a[0]) == router.route(key, run_b[0])  # identical: nothing to tell
    ida, idb = router.route(key, run_a[1]), router.route(key, run_b[1])
    assert ida != idb
    assert router.route(key, [*run_b[1], {"role": "assistant", "content": "B2"}, {"role": "user", "content": "more"}]) == idb
    assert router.route(key, [*run_a[1], {"role": "assistant", "content": "A2"}, {"role": "user", "content": "more"}]) == ida


def test_a_retry_is_the_same_conversation_and_an_edit_only_for_a_clients_own_id() -> None:
    chat = aider_chat("a", 6)
    key = key_of(chat[0])
    for branches in (False, True):
        router = SessionRouter()
        for req in chat:
            sid = router.route(key, req, branches=branches)
        assert router.route(key, chat[-1], branches=branches) == sid  # the same request again
        assert router.route(key, chat[-1][:-1], branches=branches) == sid  # the last message dropped
        # (a tail added to the newest user message is the same turn retold: aider's reminder)
        assert router.route(key, [*chat[-1][:-2], {"role": "user", "content": "a: request 5, please"}, chat[-1][-1]], branches=branches) == sid
        edited = [*chat[-1][:-2], {"role": "user", "content": "a: edited request 5"}, chat[-1][-1]]
        again = router.route(key, edited, branches=branches)
        assert (again == sid) is branches
        # the client's own rewrite (its /compact) shares only the opening: a new conversation
        rewrite = [SYSTEM, {"role": "user", "content": EXAMPLE[0]["content"]}, {"role": "user", "content": "summary of the conversation"}]
        assert router.route(key, rewrite, branches=branches) not in (sid, again)


def test_markers_and_string_blocks_do_not_make_another_message() -> None:
    plain = {"role": "user", "content": "hi"}
    marked = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
    assert message_digest(plain) == message_digest(marked) == message_digest(json.loads(json.dumps(marked)))
    assert message_digest({"content": "hi", "role": "user"}) == message_digest(plain)
    assert message_digest({"role": "user", "content": "ho"}) != message_digest(plain)
    assert message_digest({"role": "assistant", "content": "hi"}) != message_digest(plain)


def test_the_newest_marker_moving_each_turn_keeps_one_session() -> None:
    router = SessionRouter()
    history: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    ids = set()
    for k in range(15):
        sent = json.loads(json.dumps(history))
        sent[-1] = {**sent[-1], "content": [{"type": "text", "text": content_of(sent[-1]), "cache_control": {"type": "ephemeral"}}]}
        ids.add(router.route("cc:x", sent, branches=True))
        history = [*history, {"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": f"u{k}"}]
    assert ids == {"cc:x"}


def content_of(m: dict[str, Any]) -> str:
    c = m["content"]
    return c if isinstance(c, str) else c[0]["text"]


def test_memory_is_bounded_least_recently_used_first() -> None:
    router = SessionRouter(per_key=2, max_keys=3)
    chats = [aider_chat(t, 3) for t in "abc"]
    key = key_of(chats[0][0])
    ids = [router.route(key, c[0]) for c in chats]
    assert len(set(ids)) == 3
    # "a" was the least recently used: forgotten, its next turn starts a new conversation
    assert router.route(key, chats[2][1]) == ids[2]
    assert router.route(key, chats[1][1]) == ids[1]
    assert router.route(key, chats[0][1]) not in ids
    for k in range(4):
        router.route(f"other-{k}", chats[0][0])
    assert not router.knows(key) and router.knows("other-3")


def test_new_ids_are_the_same_in_every_router_and_a_seeded_router_resumes_the_right_one() -> None:
    a, b = aider_chat("a", 6), aider_chat("b", 6)
    key = key_of(a[0])
    first, second = SessionRouter(), SessionRouter()
    for router in (first, second):
        for ra, rb in zip(a[:3], b[:3], strict=True):
            router.route(key, ra)
            router.route(key, rb)
    assert first.route(key, a[3]) == second.route(key, a[3]) == key
    id_b = first.route(key, b[3])
    assert second.route(key, b[3]) == id_b != key
    # a restart: the router starts empty; seeded with the sessions the store holds under the
    # key (their histories as last recorded), a returning chat finds its own session
    restarted = SessionRouter()
    assert not restarted.knows(key)
    restarted.seed(key, key, a[3])
    restarted.seed(key, id_b, b[3])
    assert restarted.knows(key)
    assert restarted.route(key, b[4]) == id_b
    assert restarted.route(key, a[4]) == key
    assert restarted.route(key, aider_chat("c", 1)[0]) not in (key, id_b)


def test_sample_positions_stay_put_as_the_history_grows() -> None:
    assert sample_positions(0) == ()
    assert sample_positions(1) == (0,)
    assert sample_positions(40) == (0, 1, 2, 4, 8, 16, 32, 36, 37, 38, 39)
    for n in range(1, 300):
        later = set(sample_positions(n + 7))
        assert {p for p in sample_positions(n) if p < n - 4} <= later
        assert len(sample_positions(n)) <= n.bit_length() + 5


def test_concurrent_chats_each_keep_their_session() -> None:
    router = SessionRouter()
    chats = {t: aider_chat(t, 15) for t in "abcdef"}
    key = key_of(chats["a"][0])
    seen: dict[str, set[str]] = {t: set() for t in chats}

    def run(tag: str) -> None:
        for req in chats[tag]:
            seen[tag].add(router.route(key, req))

    threads = [threading.Thread(target=run, args=(t,)) for t in chats]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(ids) == 1 for ids in seen.values())
    assert len({next(iter(ids)) for ids in seen.values()}) == len(chats)


def _interleave(router: SessionRouter, chats: list[list[list[dict[str, Any]]]], order: list[int], key: str, branches: bool) -> dict[int, set[str]]:
    step = [0] * len(chats)
    ids: dict[int, set[str]] = {}
    for c in order:
        req = chats[c][min(step[c], len(chats[c]) - 1)]
        step[c] += 1
        ids.setdefault(c, set()).add(router.route(key, req, branches=branches))
    return ids


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_interleaved_conversations_under_a_derived_key_never_share_a_session(order: list[int]) -> None:
    # up to four aider chats (the same example exchange and files), advancing in any
    # interleaving: each is one session and no two are the same one
    router = SessionRouter()
    chats = [aider_chat(str(c), 12) for c in range(4)]
    ids = _interleave(router, chats, order, key_of(chats[0][0]), branches=False)
    assert all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_a_clients_sub_agents_and_side_requests_are_sessions_of_their_own(order: list[int]) -> None:
    # under one client id: the main conversation, sub-agents and a title request, which share
    # at most the system prompt, in any interleaving
    def agent(tag: str, turns: int) -> list[list[dict[str, Any]]]:
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are Claude Code."}, {"role": "user", "content": f"{tag}: the task"}]
        out = []
        for k in range(turns):
            out.append(json.loads(json.dumps(history)))
            history = [*history, {"role": "assistant", "content": f"{tag}: step {k}"}, {"role": "user", "content": f"{tag}: result {k}"}]
        return out

    chats = [agent("main", 12), agent("explore", 6), agent("plan", 6), [[{"role": "user", "content": "Write a 5-word title for: the task"}]]]
    router = SessionRouter()
    ids = _interleave(router, chats, order, f"cc:{UUID_A}", branches=True)
    assert all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)
    if 0 in ids:
        assert ids[0] == {f"cc:{UUID_A}"} or order.index(0) > 0


def test_a_clients_own_compaction_stays_its_session_and_a_sub_agent_does_not() -> None:
    # Claude Code compacts by itself: a new history ("This session is being continued …")
    # under the same session id and system prompt; its sub-agents have prompts of their own
    main_system = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
    sub_system = [{"type": "text", "text": "You are an agent for Claude Code: explore the code."}]
    key = f"cc:{UUID_A}"
    main_prompt = system_prompt_digest(main_system, [])
    assert main_prompt == system_prompt_digest([{"type": "text", "text": "You are Claude Code."}], [])  # markers left out
    router = SessionRouter()
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix the build"}]
    for k in range(6):
        assert router.route(key, history, branches=True, prompt=main_prompt) == key
        history = [*history, {"role": "assistant", "content": f"step {k}"}, {"role": "user", "content": f"result {k}"}]
    sub = [{"role": "user", "content": "find where the build breaks"}]
    sub_id = router.route(key, sub, branches=True, prompt=system_prompt_digest(sub_system, []))
    assert sub_id != key
    rewrite = [{"role": "user", "content": "This session is being continued from a previous conversation. Summary: …"}]
    assert router.route(key, rewrite, branches=True, prompt=main_prompt) == key
    assert router.route(key, [*rewrite, {"role": "assistant", "content": "go"}, {"role": "user", "content": "r"}], branches=True, prompt=main_prompt) == key
    assert router.route(key, [*sub, {"role": "assistant", "content": "found"}, {"role": "user", "content": "r"}], branches=True, prompt=system_prompt_digest(sub_system, [])) == sub_id
    # without the client's own id (a derived key), or without a prompt, a new history is a new conversation
    assert router.route(key, [{"role": "user", "content": "another rewrite"}], branches=True) != key
    derived = SessionRouter()
    derived.route("px-1", history, prompt=main_prompt)
    assert derived.route("px-1", rewrite, prompt=main_prompt) != "px-1"


def test_the_system_prompt_digest_reads_openai_system_messages() -> None:
    msgs = [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"}, {"role": "user", "content": "u"}, {"role": "system", "content": "late"}]
    assert system_prompt_digest(None, msgs) == system_prompt_digest(None, msgs[:3])
    assert system_prompt_digest(None, msgs) != system_prompt_digest(None, msgs[1:])
    assert system_prompt_digest("a", []) != system_prompt_digest("b", [])


def test_session_for_puts_the_sources_together() -> None:
    router = SessionRouter()
    history = [{"role": "user", "content": "fix the build"}]
    body = {"model": "claude", "system": "You are Claude Code.", "messages": history, "metadata": {"user_id": json.dumps({"session_id": UUID_A})}}
    # a name is taken as is, whatever the history
    assert session_for(router, "anthropic", {SESSION_HEADER: "mine"}, body, body["system"], history) == "mine"
    assert session_for(router, "anthropic", {}, body, body["system"], history) == f"cc:{UUID_A}"
    rewrite = [{"role": "user", "content": "This session is being continued …"}]
    assert session_for(router, "anthropic", {}, {**body, "messages": rewrite}, body["system"], rewrite) == f"cc:{UUID_A}"
    side = [{"role": "user", "content": "a title for: fix the build"}]
    assert session_for(router, "anthropic", {}, {**body, "system": "Write titles."}, "Write titles.", side).startswith(f"cc:{UUID_A}.")
    # no id: the derived one, routed
    plain = {"model": "gpt", "messages": [{"role": "system", "content": "s"}, *history]}
    derived = session_for(router, "openai", {"authorization": "Bearer k"}, plain, None, plain["messages"])
    assert derived == derive_session_id("openai", {"authorization": "Bearer k"}, None, plain["messages"])
    with pytest.raises(SessionIdError):
        session_for(router, "openai", {SESSION_HEADER: "no good!"}, plain, None, plain["messages"])


def test_session_key_says_what_is_routed_and_how() -> None:
    history = [{"role": "user", "content": "fix the build"}]
    body = {"model": "claude", "system": "You are Claude Code.", "messages": history, "metadata": {"user_id": json.dumps({"session_id": UUID_A})}}
    assert session_key("anthropic", {SESSION_HEADER: "mine"}, body, body["system"], history) == SessionKey("mine", False)
    own = session_key("anthropic", {}, body, body["system"], history)
    assert own == SessionKey(f"cc:{UUID_A}", True, True, system_prompt_digest("You are Claude Code.", []))
    cache_key = session_key("openai", {}, {"prompt_cache_key": "user-7"}, None, history)
    assert cache_key == SessionKey("pck:user-7", True, False, None)  # maybe one key per user: no branches
    derived = session_key("openai", {}, {}, None, history)
    assert derived.routed and not derived.branches and derived.key.startswith("px-")
    # a restart: a router seeded from the store before the key's first request resumes it
    router = SessionRouter()
    assert not router.knows(own.key)
    router.seed(own.key, own.key, history, prompt=own.prompt)
    assert session_for(router, "anthropic", {}, body, body["system"], [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]) == own.key


def with_user_reminder(request: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """aider's default ``reminder: user``: the reminder appended to the newest user message
    (instead of a system message at the end), that message resent without it next turn."""
    history = request[:-1]  # the trailing system reminder of aider_chat
    last = history[-1]
    return [*history[:-1], {**last, "content": f"{last['content']}\n\nReply with whole files."}]


def test_a_reminder_appended_to_the_newest_user_message_and_dropped_next_turn_is_one_session() -> None:
    router = SessionRouter()
    a, b = [[with_user_reminder(r) for r in aider_chat(t, 8)] for t in "ab"]
    key = key_of(a[0])
    ids_a, ids_b = [], []
    for ra, rb in zip(a, b, strict=True):
        ids_a.append(router.route(key, ra))
        ids_b.append(router.route(key, rb))
    assert len(set(ids_a)) == 1 and len(set(ids_b)) == 1 and ids_a[0] != ids_b[0]
    # only the newest user message may be retold, and only by a tail: another edit is another chat
    for resent, same in (("a: request 3", True), ("a: request 3\n\nReply with whole files.\nAnd more.", True), ("request 3", False), ("a: request 9", False)):
        router = SessionRouter()
        for r in a[:4]:
            sid = router.route(key, r)
        nxt = json.loads(json.dumps(a[4]))
        at = len(a[3]) - 1  # where the newest user message of the last request was
        assert nxt[at]["content"] == "a: request 3"
        nxt[at]["content"] = resent
        assert (router.route(key, nxt) == sid) is same, resent
