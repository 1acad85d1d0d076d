"""Server-sent events: split a byte stream into events, and follow a chat stream.

The proxy relays upstream bytes as they arrive. Beside the relay it feeds the same bytes to an
:class:`EventSplitter` and each complete event to a tracker, which reads the usage from the
stream's final events and rebuilds the assistant turn (text, thinking, tool calls) so that the
proxy can answer the engine's own tools and continue the conversation.

When the engine's tools were added to the request, the relay goes event by event instead, and
asks the tracker what the client may see (:meth:`StreamTracker.visible`): events about the
engine's tool calls are held back, tool-call and content-block indices are renumbered so the
client sees a gap-free sequence, and a stream that ends with calls to the engine's tools only
does not show its end (the proxy answers them and relays the next round's stream instead).

The parts live in :mod:`~ctxengine.proxy.sse` (events, the splitter, the tracker interface),
:mod:`~ctxengine.proxy.chat_streams` (chat-completions and Messages trackers) and
:mod:`~ctxengine.proxy.responses_stream` (the Responses tracker); every name stays importable
from here.
"""

from __future__ import annotations

from ctxengine.proxy.chat_streams import AnthropicStream, OpenAIStream
from ctxengine.proxy.responses_stream import ResponsesStream
from ctxengine.proxy.sse import Event, EventSplitter, StreamEnd, StreamTracker, failure_event

__all__ = [
    "AnthropicStream",
    "Event",
    "EventSplitter",
    "OpenAIStream",
    "ResponsesStream",
    "StreamEnd",
    "StreamTracker",
    "failure_event",
]
