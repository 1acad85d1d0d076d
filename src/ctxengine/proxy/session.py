"""Which session a request belongs to.

Three sources, in this order (:func:`client_session_id`, then :func:`derive_session_id`):

1. **A name the user gave**: ``x-ctxengine-session: <name>`` (the name is the session id in the
   store, so ``ctxengine sessions show <name>`` finds it). Taken as is: every request naming it
   is that session, edits and rewrites included (the manager branches).
2. **The id the client sends for its own conversation**, as real clients send it (measured,
   see DESIGN 3.12), prefixed by its source so it never collides with a name:

   - Claude Code: the ``X-Claude-Code-Session-Id`` header, else ``metadata.user_id``, a JSON
     string ``{"device_id": …, "account_uuid": …, "session_id": "<uuid>"}`` since 2.1.78, before
     that ``user_<hash>_account_<uuid>_session_<uuid>`` → ``cc:<uuid>``;
   - Codex: the ``session-id`` / ``thread-id`` headers (``session_id`` / ``conversation_id``
     before), a sub-agent's ``x-openai-subagent`` appended → ``codex:<uuid>[:<subagent>]``;
   - opencode: the ``x-session-id`` header (``ses_…``, one per session, a sub-agent's its own)
     → ``sid:<id>``;
   - Qwen Code (its DashScope provider): ``metadata.sessionId`` in the body → ``qwen:<id>``;
   - LiteLLM's session id (``x-litellm-session-id``, which the LiteLLM hook also fills from the
     request's ``litellm_session_id`` or ``metadata.session_id``) → ``litellm:<id>``;
   - the Responses API's ``conversation`` (an id, or ``{"id": …}``) → ``conv:<id>``;
   - ``prompt_cache_key`` (Codex sets it to its session id; other callers may set one key per
     user or per app) → ``pck:<key>``.

   Not used: ``user``, ``safety_identifier`` and a ``metadata.user_id`` that is not Claude
   Code's: OpenAI defines them as the *end user's* id, the same for all of a user's
   conversations, so taking them as a session would join conversations; nor Gemini CLI's
   ``x-gemini-api-privileged-user-id`` (its installation's id). The OpenAI Agents SDK, llm,
   LangGraph, aider, Gemini CLI (on the Gemini API), pi (chat completions and messages; its
   Responses requests carry ``prompt_cache_key``) and Qwen Code's default OpenAI provider send
   no id at all.
3. **Derived** from what stays the same across the turns of one conversation: the API, a digest
   of the client's key, the system prompt's text and the first user message's text (cache markers
   and other non-text keys left out, since clients move them from turn to turn). The key itself
   never leaves this module: only a digest of it is mixed into another digest.

A derived id, and a client's id too, may be shared by several conversations: aider's first user
message is always the same example, ``claude -p`` twice with one prompt gives the same opening,
a client's sub-agents and side requests (titles, summaries) come with its session id. Those are
told apart by their histories (:class:`SessionRouter`): a request belongs to the conversation
whose history it continues (or retries), and one that continues none starts a new
conversation, never joins another one; under a client's own conversation id, an edited turn and
the client's rewrite of its history (its compaction: the same system prompt) stay in the
session (see the router for the rules and for ids that survive a restart).
:func:`routed` says which ids go through the router (all but a name the user gave).
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxengine.history import same_but_tail, without_markers
from ctxengine.messages import content_text

__all__ = [
    "SESSION_HEADER",
    "SessionIdError",
    "SessionKey",
    "SessionRouter",
    "client_session_id",
    "derive_session_id",
    "message_digest",
    "names_one_conversation",
    "routed",
    "sample_positions",
    "session_for",
    "session_from_header",
    "session_key",
    "system_prompt_digest",
]

SESSION_HEADER = "x-ctxengine-session"
_VALID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_ID_CHARS = re.compile(r"[A-Za-z0-9._:@/+=-]{1,96}")  # a client's id kept as is (the rest: a digest)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_LEGACY_CC = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")
_SOURCES = ("cc:", "codex:", "sid:", "qwen:", "litellm:", "conv:", "pck:")


class SessionIdError(ValueError):
    """The session header holds something that cannot be a session id."""


def session_from_header(value: str | None) -> str | None:
    """The session named by the header, ``None`` when absent; :class:`SessionIdError` if invalid."""
    if value is None or value == "":
        return None
    if not _VALID.fullmatch(value):
        raise SessionIdError(f"{SESSION_HEADER} must be 1-128 characters of letters, digits and . _ : @ / + = -")
    return value


def _normalised(source: str, value: str) -> str:
    """``value`` prefixed by its ``source``, in the store's id charset: kept as is when it is
    up to 96 characters of that charset, else a digest of it (two
    different ids never end up as one, as replacing characters could make them)."""
    if _ID_CHARS.fullmatch(value):
        return f"{source}:{value}"
    return f"{source}:h{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"


def _header(headers: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = headers.get(name)
        if value:
            return value.strip() or None
    return None


def _claude_code_session(user_id: Any) -> str | None:
    """The session id in Claude Code's ``metadata.user_id`` (both of its formats), else ``None``."""
    if isinstance(user_id, Mapping):
        sid = user_id.get("session_id")
        return sid if isinstance(sid, str) and sid else None
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            data = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        return _claude_code_session(data) if isinstance(data, Mapping) else None
    m = _LEGACY_CC.search(user_id)
    return m.group(1) if m and user_id.startswith("user_") else None


def client_session_id(api_name: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The session a request names itself (see the module docstring for the sources and their
    order), ``None`` when it names none (then :func:`derive_session_id`).

    ``headers`` are looked up by their lower-case names (as ASGI and Starlette's case-insensitive
    headers give them). Raises :class:`SessionIdError` for an invalid ``x-ctxengine-session``.
    ``api_name`` is the adapter's name; the sources are the same for every API (a client's id is
    looked for wherever it may be), it is accepted so that an API can get its own later.
    """
    del api_name  # (every source is looked for in every API's requests)
    named = session_from_header(headers.get(SESSION_HEADER))
    if named is not None:
        return named
    sid = _header(headers, "x-claude-code-session-id")
    if sid is None:
        metadata = body.get("metadata")
        if isinstance(metadata, Mapping):
            sid = _claude_code_session(metadata.get("user_id"))
    if sid is not None:
        return _normalised("cc", sid)
    sid = _header(headers, "session-id", "session_id", "thread-id", "conversation_id")
    if sid is not None:
        sub = _header(headers, "x-openai-subagent")  # a sub-agent (review, compact …): its own history
        return _normalised("codex", f"{sid}:{sub}" if sub else sid)
    sid = _header(headers, "x-session-id")
    if sid is not None:
        return _normalised("sid", sid)
    metadata = body.get("metadata")
    qwen = metadata.get("sessionId") if isinstance(metadata, Mapping) else None
    if isinstance(qwen, str) and qwen.strip():
        return _normalised("qwen", qwen.strip())
    sid = _header(headers, "x-litellm-session-id")
    if sid is not None:
        return _normalised("litellm", sid)
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        return _normalised("conv", conversation)
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return _normalised("pck", key)
    return None


def routed(session_id: str) -> bool:
    """Whether requests of ``session_id`` go through a :class:`SessionRouter`: a derived id or a
    client's own (one id may carry several conversations: sub-agents, side requests, a per-user
    ``prompt_cache_key``); never a name the user gave in ``x-ctxengine-session`` (every request
    naming it is that session)."""
    return session_id.startswith(("px-", *_SOURCES))


def names_one_conversation(session_id: str) -> bool:
    """Whether ``session_id`` is a client's id for one conversation of its own (Claude Code's,
    Codex's, opencode's, Qwen Code's, LiteLLM's, a Responses ``conversation``): route its
    requests with ``branches=True`` (an edited or rewound turn, which shares more than the
    opening, stays in the session). Not a derived id nor a ``prompt_cache_key`` (one key may be
    a whole user's or app's)."""
    return session_id.startswith(("cc:", "codex:", "sid:", "qwen:", "litellm:", "conv:"))


def system_prompt_digest(system: Any, messages: Sequence[Any]) -> str:
    """A digest of a request's system prompt (:meth:`SessionRouter.route`'s ``prompt``): the
    Anthropic ``system`` value's text, or (``system`` ``None``) the text of the ``system`` /
    ``developer`` messages before the first other message; markers left out."""
    if system is not None:
        text = content_text(system)
    else:
        parts = []
        for m in messages:
            if not isinstance(m, Mapping) or m.get("role") not in ("system", "developer"):
                break
            parts.append(content_text(m.get("content")))
        text = "\x00".join(parts)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _key(headers: Mapping[str, str]) -> str:
    key = headers.get("x-api-key") or headers.get("authorization") or headers.get("x-goog-api-key") or ""
    return hashlib.sha256(key.encode("utf-8")).hexdigest() if key else ""


def derive_session_id(api: str, headers: Mapping[str, str], system: Any, messages: Sequence[Any]) -> str:
    """The deterministic id of a conversation (see the module docstring): ``px-`` + 24 hex digits.

    ``system`` is the Anthropic ``system`` value (``None`` for OpenAI, whose system prompt is
    the first ``system``/``developer`` message of ``messages``).
    """
    system_text = content_text(system) if system is not None else ""
    first_user = ""
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = m.get("role")
        if system is None and not system_text and role in ("system", "developer"):
            system_text = content_text(m.get("content"))
        elif role == "user" or (role is None and "parts" in m):
            content = m.get("content", m.get("parts"))  # a Gemini content's parts
            if isinstance(content, list):  # Anthropic tool results are not the opening message
                content = [p for p in content if not (isinstance(p, Mapping) and p.get("type") == "tool_result")]
            first_user = content_text(content)
            break
    h = hashlib.sha256()
    for part in (api, _key(headers), system_text, first_user):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return "px-" + h.hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class SessionKey:
    """Where a request's session comes from (:func:`session_key`): ``key`` is the session itself
    when not ``routed`` (a name the user gave), else what :meth:`SessionRouter.route` takes with
    ``branches`` and ``prompt``."""

    key: str
    routed: bool
    branches: bool = False
    prompt: str | None = None


def session_key(api_name: str, headers: Mapping[str, str], body: Mapping[str, Any], system: Any, messages: Sequence[Any]) -> SessionKey:
    """The key a request's session is found by, all sources together (a name the user gave, the
    client's own id, a derived id); :func:`session_for` routes it. Apart for a caller that does
    something between the two, e.g. seeds the router from the store on a key's first request
    after a restart (:meth:`SessionRouter.knows`, :meth:`SessionRouter.seed`).

    ``system`` is the Anthropic ``system`` value (``None`` for OpenAI-form messages, whose
    system prompt is in ``messages``); ``messages`` the request's history as sent. Raises
    :class:`SessionIdError` for an invalid ``x-ctxengine-session``.
    """
    cid = client_session_id(api_name, headers, body)
    if cid is not None and not routed(cid):
        return SessionKey(cid, False)
    if cid is None:
        return SessionKey(derive_session_id(api_name, headers, system, messages), True)
    own = names_one_conversation(cid)
    return SessionKey(cid, True, own, system_prompt_digest(system, messages) if own else None)


def session_for(router: SessionRouter, api_name: str, headers: Mapping[str, str], body: Mapping[str, Any], system: Any, messages: Sequence[Any]) -> str:
    """The session of one request (what the proxy calls per request, before planning): a name
    the user gave as is; else the client's own id, or the derived one, routed by the request's
    history (:class:`SessionRouter`; a client's own conversation id with ``branches`` and its
    system prompt, so that its rewrite stays in it). Arguments as :func:`session_key` takes them."""
    k = session_key(api_name, headers, body, system, messages)
    return router.route(k.key, messages, branches=k.branches, prompt=k.prompt) if k.routed else k.key


# -- telling conversations apart by their histories ---------------------------------------------


def message_digest(message: Any) -> bytes:
    """A digest of one message as the router compares it: its content without cache markers
    (:func:`~ctxengine.history.without_markers`: a marker moved, or string content sent as one
    marked text block, is the same message), keys in any order."""
    plain = without_markers(message)
    try:
        data = orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        data = repr(plain).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=12).digest()


@functools.lru_cache(maxsize=4096)
def sample_positions(n: int) -> tuple[int, ...]:
    """The positions of a history of ``n`` messages that the router keeps: the first, every
    power of two (1, 2, 4, 8 …) and the last four. A later request that continues the history
    agrees at every one of them; another conversation that only shares the opening differs at
    its latest messages, or at one of the positions spread back to the opening. The powers of
    two stay where they are as the history grows (about ``log2(n) + 5`` positions)."""
    out = {0} if n > 0 else set()
    p = 1
    while p < n:
        out.add(p)
        p *= 2
    out.update(range(max(0, n - 4), n))
    return tuple(sorted(out))


def _history_length(messages: Sequence[Any]) -> int:
    """How many messages of a request are its history: all but the system or developer
    messages after the last other one (aider ends every request with a reminder that the next
    request does not carry), unless the request holds nothing else."""
    n = len(messages)
    while n > 0 and isinstance(messages[n - 1], Mapping) and messages[n - 1].get("role") in ("system", "developer"):
        n -= 1
    return n or len(messages)


def _opening(messages: Sequence[Any]) -> int:
    """How many messages the opening is: up to and including the first user message."""
    for i, m in enumerate(messages):
        if isinstance(m, Mapping) and m.get("role") == "user":
            return i + 1
    return len(messages)


@dataclass(slots=True)
class _Conversation:
    id: str
    length: int  # messages of the latest request routed to it
    samples: dict[int, Any]  # position -> the message there, at sample_positions(length), in order
    opening: int = 0
    prompt: object = None  # what the caller says stays the same for the client's conversation (its system prompt)


@dataclass(slots=True)
class _Key:
    conversations: OrderedDict[str, _Conversation] = field(default_factory=OrderedDict)  # least recent first
    used: set[str] = field(default_factory=set)  # every id handed out for the key


class SessionRouter:
    """Which conversation under one session key a request continues (pure: no I/O; thread-safe).

    :meth:`route` takes the key (a derived id, or a client's id: :func:`routed`) and the
    request's history (its messages as sent, in the API's own form) and returns the session id:

    * a request whose history **continues** a live conversation of the key (the conversation's
      last history is a prefix of this one: the usual turn, cache markers ignored) is that
      conversation; the longest such one when several are (a retry of a shorter one is rare).
      The conversation's newest user message may come back with a tail added or dropped:
      aider (``reminder: user``, its default) appends its reminder to the newest user message
      and resends that message without it next turn, a rewrite of its own tail, not another
      conversation (the manager branches at that message: the store keeps both versions as
      sent, and nothing dropped goes upstream again);
    * a request whose history **is a prefix** of a live conversation's last one (a retry, a
      regenerated answer: the client dropped its latest messages) is that conversation;
    * with ``branches=True`` (a client's own id), a request that shares more than the opening
      with a live conversation (its messages agree with the conversation's up to a position
      past the first user message, then differ: an edited turn, a rewound conversation) is a
      branch of that conversation; the manager branches its working context. Without it (a
      derived key) such a request starts a new conversation: two aider chats share their whole
      example exchange and files message, and their turns are indistinguishable from edits of
      one another, so joining them would make each turn of one a branch of the other (the
      compaction after compaction measured with two chats). A user who edits a turn of a
      client that sends no id gets a new session: what it costs is the compaction state, never
      a wrong context;
    * with ``branches=True`` and a ``prompt`` (:func:`system_prompt_digest`), a request that
      shares nothing with any live conversation but has the system prompt of the key's own
      conversation (the one named by the key) is **the client's rewrite** of it (Claude Code's
      compaction starts a new history under the same session id; Codex keeps its session id
      across its compaction): that conversation, where the manager takes the new history as
      given (nothing of the dropped turns comes back) and recall still finds the old turns.
      A sub-agent or a side request (a title) has a system prompt of its own: a new one;
    * any other request starts a **new conversation**: the first one of a key is the key
      itself (one conversation per key, the usual case, keeps the id it always had), the next
      ones ``<key>.<8 hex>``, a digest of the request that started them.

    Per key at most ``per_key`` live conversations are kept (the least recently used goes; a
    request that continued it starts a new conversation) and at most ``max_keys`` keys; a
    conversation keeps references to a few of its messages (:func:`sample_positions`), the
    ones it is compared by.

    **After a restart** the router is empty. The first request of a key would get the key itself,
    which may be another conversation's record in the store. So before routing a key's first
    request the proxy reads the key's conversations back from the store: each session ``<key>``
    and ``<key>.…`` with its original history, in the API's form, goes to :meth:`seed` (for
    the Anthropic API, the store's OpenAI-form originals converted back). The request then
    continues the right one, whose session :meth:`ContextManager.resume_session
    <ctxengine.ContextManager.resume_session>` resumes, or starts a new one under a new id.
    :meth:`knows` says whether a key has been seen or seeded since the start.
    """

    def __init__(self, *, per_key: int = 8, max_keys: int = 1024) -> None:
        if per_key < 1 or max_keys < 1:
            raise ValueError("per_key and max_keys must be at least 1")
        self.per_key = per_key
        self.max_keys = max_keys
        self._keys: OrderedDict[str, _Key] = OrderedDict()
        self._lock = threading.Lock()

    def knows(self, key: str) -> bool:
        """Whether ``key`` has been routed or seeded (and not evicted) since this router started."""
        with self._lock:
            return key in self._keys

    def seed(self, key: str, conversation_id: str, messages: Sequence[Any], *, prompt: object = None) -> None:
        """Make ``conversation_id`` a live conversation of ``key`` whose last history is
        ``messages`` (a session read back from the store after a restart; ``prompt`` as
        :meth:`route` takes it)."""
        messages = messages[: _history_length(messages)]
        conv = _Conversation(conversation_id, len(messages), _samples(messages), _opening(messages), prompt)
        with self._lock:
            entry = self._entry(key)
            entry.used.add(conversation_id)
            entry.conversations[conversation_id] = conv
            entry.conversations.move_to_end(conversation_id)
            self._bound(entry)

    def route(self, key: str, messages: Sequence[Any], *, branches: bool = False, prompt: object = None) -> str:
        """The session id of a request under ``key`` with history ``messages`` (see the class
        docstring). ``messages`` is read, never kept or changed. System or developer messages
        after the last other one are not history (:func:`_history_length`)."""
        messages = messages[: _history_length(messages)]
        m = len(messages)
        samples = _samples(messages)
        with self._lock:
            entry = self._entry(key)
            best = self._continued(entry, messages, m, branches)
            if best is None and branches and prompt is not None:
                # the client's own rewrite of its conversation (its /compact): another history,
                # the same system prompt; a sub-agent or a side request has a prompt of its own
                main = entry.conversations.get(key)
                if main is not None and main.prompt == prompt:
                    best = main
            if best is None:
                sid = key if key not in entry.used else self._new_id(key, entry, samples)
                entry.used.add(sid)
                best = _Conversation(sid, 0, {})
            best.length, best.samples, best.opening, best.prompt = m, samples, _opening(messages), prompt
            entry.conversations[best.id] = best
            entry.conversations.move_to_end(best.id)
            self._bound(entry)
            return best.id

    # -- under the lock ---------------------------------------------------------------------
    def _entry(self, key: str) -> _Key:
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key()
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return entry

    def _bound(self, entry: _Key) -> None:
        while len(entry.conversations) > self.per_key:
            entry.conversations.popitem(last=False)

    def _continued(self, entry: _Key, messages: Sequence[Any], m: int, branches: bool) -> _Conversation | None:
        """The live conversation the request continues, retries or (``branches``) branches."""
        best: _Conversation | None = None
        best_rank: tuple[int, int] = (-1, -1)
        for conv in entry.conversations.values():  # least recent first: a tie goes to the latest
            agree = _agreement(conv, messages, m)
            if agree is None:
                continue
            shared, whole = agree
            if whole:  # continues it (or is it again): the longest wins
                rank = (2, conv.length)
            elif m < conv.length and shared >= m:  # a prefix of it: a retry
                rank = (1, shared)
            elif branches and shared > max(conv.opening, 1):
                rank = (0, shared)
            else:
                continue
            if rank >= best_rank:
                best, best_rank = conv, rank
        return best

    def _new_id(self, key: str, entry: _Key, samples: Mapping[int, Any]) -> str:
        """``<key>.<8 hex>``: a digest of the request that starts the conversation (the same in
        every router, markers left out)."""
        h = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16)
        for i, message in samples.items():
            h.update(i.to_bytes(8, "little"))
            h.update(message_digest(message))
        base = f"{key}.{h.hexdigest()[:8]}"
        sid, n = base, 1
        while sid in entry.used:  # the same request again after its conversation was evicted
            n += 1
            sid = f"{base}-{n}"
        return sid


def _samples(messages: Sequence[Any]) -> dict[int, Any]:
    return {i: messages[i] for i in sample_positions(len(messages))}


def _retold(message: Any, seen: Any) -> bool:
    """Whether ``message`` is the conversation's newest user message ``seen`` sent again with a
    tail added or dropped (aider's ``reminder: user`` appends its reminder to the newest user
    message and resends that message without it next turn): the same turn, not another chat."""
    return isinstance(seen, Mapping) and seen.get("role") == "user" and same_but_tail(message, seen)


def _agreement(conv: _Conversation, messages: Sequence[Any], m: int) -> tuple[int, bool] | None:
    """How far the request agrees with ``conv``'s last history: ``(shared, whole)``, ``shared``
    a lower bound of the messages they have in common (one past the furthest sampled position
    where they agree, every sampled position before it agreeing too), ``whole`` when every
    sample of ``conv`` agrees and the request is at least as long. ``None`` when they differ at
    the very first sampled position (nothing shared). Messages are compared as objects (the
    same object, or equal: in C), and without their markers only where that fails; the
    conversation's last message, when a user message, also agrees with itself retold with a
    tail added or dropped (:func:`_retold`)."""
    shared = 0
    whole = m >= conv.length
    last = conv.length - 1
    for i, seen in conv.samples.items():
        if i >= m:
            whole = False
            break
        a = messages[i]
        if a is not seen and a != seen and without_markers(a) != without_markers(seen) and not (i == last and _retold(a, seen)):
            whole = False
            break
        shared = i + 1
    if not shared:
        return None
    if whole:
        return conv.length, True
    return shared, False
