"""``ctxengine proxy``: context management for any agent that takes a base URL.

An OpenAI- and Anthropic-compatible HTTP proxy (Starlette on uvicorn, aiohttp upstream) that
runs a :class:`ctxengine.ContextManager` per session between the agent and its provider. Needs
``pip install 'ctxengine[proxy]'``; nothing else in ctxengine imports this package.

See :mod:`ctxengine.proxy.app` for what happens to each request.
"""

from __future__ import annotations

from ctxengine.proxy.app import TOKEN_HEADER, TOKENS_SAVED_HEADER, Proxy, create_app
from ctxengine.proxy.server import ProxyServer, check_bind, serve
from ctxengine.proxy.session import SESSION_HEADER

__all__ = ["SESSION_HEADER", "TOKENS_SAVED_HEADER", "TOKEN_HEADER", "Proxy", "ProxyServer", "check_bind", "create_app", "serve"]
