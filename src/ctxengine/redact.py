"""Redaction: the one place secrets are removed from text ctxengine writes anywhere.

What reaches an error message, ``last_error``, ``status()``, a log line or a ``compactions``
row passes through :func:`redact` first. It removes, in this order:

1. **Registered secrets** — every API key a client was configured with
   (:func:`register_secret`), wherever it appears, even inside a provider's error body or a
   reply that echoes it. Registration is process-wide: a key seen once is never printed.
2. **Credentials in URLs** — ``scheme://user:password@host`` keeps the host and loses the user
   part; query parameters that carry keys (``key``, ``api_key``, ``token``, ``sig``, …) keep their
   name and lose their value.
3. **Credential headers** — ``Authorization: Bearer …``, ``x-api-key: …``, ``api-key=…``.
4. **Key shapes** — strings that look like provider keys whoever they belong to: ``sk-…``
   (OpenAI, Anthropic, OpenRouter), ``AKIA…``/``ASIA…`` (AWS), ``ghp_…``/``github_pat_…``
   (GitHub), ``xox?-…`` (Slack), ``AIza…`` (Google), ``glpat-…`` (GitLab), JWTs.

Every removed span becomes :data:`MARK` (``[REDACTED]``), so a reader can see something was
there. Message *content* is not touched unless asked: the opt-in ``redaction.content`` setting
applies :func:`redact_messages` (key shapes, URL credentials and registered secrets) to the
messages before they are summarized or stored.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "MARK",
    "RedactingFilter",
    "clear_secrets",
    "redact",
    "redact_messages",
    "redact_obj",
    "redact_url",
    "register_secret",
]

MARK = "[REDACTED]"

MIN_SECRET_CHARS = 6
"""Shorter configured "keys" (``x``, ``none``) are not treated as secrets: replacing them
everywhere would garble every text."""

_lock = threading.Lock()
_secrets: set[str] = set()
_secret_re: re.Pattern[str] | None = None

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/\s@?#]+)@")
_QUERY_KEYS = (
    "key", "api_key", "apikey", "api-key", "access_token", "token", "auth", "sig", "signature",
    "password", "passwd", "pwd", "secret", "client_secret", "x-api-key", "code",
)
_QUERY_PARAM = re.compile(r"(?i)([?&;](?:" + "|".join(re.escape(k) for k in _QUERY_KEYS) + r")=)([^&#\s\"'<>]+)")
_HEADERS = re.compile(
    r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|x-goog-api-key|openai-api-key|anthropic-api-key)"
    r"(\"?\s*[:=]\s*\"?)(?:(bearer|basic|token)\s+)?([^\s\"',;}]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9\-._~+/]{8,}=*)")
_SHAPES = re.compile(
    r"(?x)"
    r"\bsk-(?:ant-|proj-|or-v1-|or-)?[A-Za-z0-9_\-]{16,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{40,}"
    r"|\bglpat-[A-Za-z0-9_\-]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|\bAIza[0-9A-Za-z_\-]{35}"
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"
)


def register_secret(value: str | None) -> None:
    """Remember ``value`` (an API key, a DSN password) so :func:`redact` removes it everywhere."""
    global _secret_re
    if not value or not isinstance(value, str) or len(value.strip()) < MIN_SECRET_CHARS:
        return
    with _lock:
        if value in _secrets:
            return
        _secrets.add(value)
        # longest first, so a key that contains another is removed whole
        _secret_re = re.compile("|".join(re.escape(s) for s in sorted(_secrets, key=len, reverse=True)))


def clear_secrets() -> None:
    """Forget every registered secret (tests)."""
    global _secret_re
    with _lock:
        _secrets.clear()
        _secret_re = None


def redact(text: str, *, secrets: Iterable[str | None] = (), shapes: bool = True) -> str:
    """``text`` with registered secrets, ``secrets``, URL credentials, credential headers and
    (unless ``shapes=False``) key-shaped strings replaced by :data:`MARK`."""
    if not isinstance(text, str) or not text:
        return text
    extra = [s for s in secrets if s and len(s) >= MIN_SECRET_CHARS]
    for s in sorted(extra, key=len, reverse=True):
        text = text.replace(s, MARK)
    rx = _secret_re
    if rx is not None:
        text = rx.sub(MARK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MARK}@", text)
    text = _QUERY_PARAM.sub(lambda m: f"{m.group(1)}{MARK}", text)
    text = _HEADERS.sub(lambda m: f"{m.group(1)}{m.group(2)}{(m.group(3) + ' ') if m.group(3) else ''}{MARK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MARK}", text)
    if shapes:
        text = _SHAPES.sub(MARK, text)
    return text


def redact_url(url: str | None) -> str:
    """A URL fit to print: no ``user:password@``, no key-carrying query values."""
    if not url:
        return ""
    return redact(str(url))


def redact_obj(value: Any, *, shapes: bool = True) -> Any:
    """A copy of a JSON-like value with every string (keys too) passed through :func:`redact`."""
    if isinstance(value, str):
        return redact(value, shapes=shapes)
    if isinstance(value, Mapping):
        return {redact_obj(k, shapes=shapes) if isinstance(k, str) else k: redact_obj(v, shapes=shapes) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_obj(v, shapes=shapes) for v in value]
    return value


def redact_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` whose text (content, text parts, tool-call arguments, reasoning)
    has key shapes, URL credentials and registered secrets removed. Roles, ids, structure and
    messages without a secret are unchanged (the same content gives the same bytes, so prompt
    caches and the content-addressed store are not disturbed)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        new = copy.deepcopy(dict(m))
        _redact_message_in_place(new)
        out.append(new)
    return out


def _redact_message_in_place(m: dict[str, Any]) -> None:
    content = m.get("content")
    if isinstance(content, str):
        m["content"] = redact(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                for key in ("text", "thinking"):
                    if isinstance(part.get(key), str):
                        part[key] = redact(part[key])
    for key in ("reasoning_content", "reasoning"):
        if isinstance(m.get(key), str):
            m[key] = redact(m[key])
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                fn["arguments"] = redact(fn["arguments"])


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's final message (install it on handlers:
    filters on a logger do not apply to its children's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave the record to logging's own error path
            return True
        clean = redact(message)
        if clean != message:
            record.msg = clean
            record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # the formatted traceback would print the exception text unredacted
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
