"""The LLM summarizer under server faults: one deadline, a cooldown, bounded replies, no secret
in any error (against the stub server over real HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.clients.anthropic_client import AnthropicClient
from ctxengine.clients.openai_compat import OpenAICompatClient
from ctxengine.errors import SummarizerAuthError, SummarizerError
from ctxengine.messages import Message
from ctxengine.redact import MARK, clear_secrets
from ctxengine.summarize.base import CUT_NOTE, bound_summary, has_template, render_sections
from ctxengine.summarize.llm import LlmSummarizer
from ctxengine.testing.stub_server import StubReply, StubServer
from ctxengine.tokens import estimate

TEMPLATE = render_sections({"Goal": ["- stub goal"], "Progress/Done": ["- stub work"]})
KEY = "sk-test-0123456789abcdefSECRET"


@pytest.fixture(autouse=True)
def _forget_secrets() -> None:
    clear_secrets()


def span() -> list[Message]:
    return [
        {"role": "user", "content": "Fix the login bug in src/auth/login.py."},
        {"role": "assistant", "content": "Looking at it."},
    ]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def summarizer(url: str, **kw: object) -> LlmSummarizer:
    client = OpenAICompatClient(base_url=url, api_key=KEY, timeout=float(kw.pop("timeout", 5.0)))  # type: ignore[arg-type]
    kw.setdefault("sleep", lambda _s: None)
    return LlmSummarizer(client, "stub-model", context_length=16_000, **kw)  # type: ignore[arg-type]


def test_a_trickling_body_is_cut_off_at_the_deadline() -> None:
    # one byte every 50 ms: each byte resets the read timeout, the whole body would take minutes
    with StubServer(default=StubReply(text=TEMPLATE, trickle=0.05)) as server:
        s = summarizer(server.openai_base_url, deadline=1.5, timeout=5.0, retries=3)
        s.client._client()  # type: ignore[attr-defined]  # the SDK's import is not what is measured
        t0 = time.monotonic()
        with pytest.raises(SummarizerError, match="deadline"):
            s.summarize(span())
        assert time.monotonic() - t0 < 4.0  # a hang check, not a benchmark: the body needs > 60 s
        assert s.abandoned == 1 and server.calls == 1


def _call_threads_alive() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if t.name == "ctxengine-summarizer-call" and t.is_alive())


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_timeout_bounds_the_whole_call_not_each_read(api: str) -> None:
    # the case: the server answers at once, then sends 2 bytes a second; the SDK's
    # read timeout (2 s) never fires, the deadline (90 s) is far: the timeout must end the call
    with StubServer(default=StubReply(text=TEMPLATE, trickle=0.5)) as server:
        if api == "openai":
            client: OpenAICompatClient | AnthropicClient = OpenAICompatClient(base_url=server.openai_base_url, api_key=KEY, timeout=0.6)
        else:
            client = AnthropicClient(base_url=server.anthropic_base_url, api_key=KEY, timeout=0.6)
        s = LlmSummarizer(client, "stub-model", context_length=16_000, timeout=0.6, deadline=90.0, retries=0)
        client._client()  # the SDK's import is not what is measured
        t0 = time.monotonic()
        with pytest.raises(SummarizerError, match=r"longer than its 0\.6s timeout"):
            s.summarize(span())
        assert time.monotonic() - t0 < 2.5  # the body alone needs minutes
        assert s.abandoned == 1 and server.calls == 1
        # the abandoned call does not keep reading: its connection was closed under it
        stop = time.monotonic() + 5.0
        while _call_threads_alive() and time.monotonic() < stop:
            time.sleep(0.05)
        assert _call_threads_alive() == 0


def test_retries_of_a_trickling_server_stay_within_timeout_times_attempts() -> None:
    with StubServer(default=StubReply(text=TEMPLATE, trickle=0.5)) as server:
        client = OpenAICompatClient(base_url=server.openai_base_url, api_key=KEY, timeout=0.5)
        s = LlmSummarizer(client, "stub-model", context_length=16_000, timeout=0.5, deadline=90.0, retries=2, sleep=lambda _s: None)
        client._client()
        t0 = time.monotonic()
        with pytest.raises(SummarizerError, match="after 3 attempts"):
            s.summarize(span())
        assert time.monotonic() - t0 < 3 * 0.5 + 2.5  # three bounded calls (the backoff waits are stubbed)
        assert s.abandoned == 3 and server.calls <= 3  # a call abandoned before its request was read is not counted there


def test_a_trickling_summarizer_gives_way_to_the_extractive_summary_in_prepare(tmp_path: pytest.TempPathFactory) -> None:
    from ctxengine import ContextManager
    from ctxengine.config import Config

    msgs: list[Message] = [{"role": "system", "content": "You are an agent."}]
    for t in range(30):
        msgs += [
            {"role": "user", "content": f"request {t}: handle item-{t} " + "and keep it tidy " * 8},
            {"role": "assistant", "content": f"done with item {t}; " + "details " * 40},
        ]
    with StubServer(default=StubReply(text=TEMPLATE, trickle=0.5)) as server:
        cfg = Config.from_dict(
            {
                "auxiliary": {"compression": {"provider": "custom", "model": "stub", "base_url": server.openai_base_url, "context_length": 64_000, "timeout": 0.5, "max_retries": 0}},
                "store": {"path": str(tmp_path / "s.db")},  # type: ignore[operator]
            }
        )
        ctx = ContextManager.from_config(cfg, model="gpt-4o", context_length=4_000)
        t0 = time.monotonic()
        out = ctx.prepare(msgs)
        assert time.monotonic() - t0 < 10.0  # the default 90 s deadline is not what ended it
        assert server.calls == 1
    assert len(out) < len(msgs)  # compacted all the same
    assert "extractive" in json.dumps(ctx.status(), default=str)


def test_a_retry_after_beyond_the_deadline_ends_the_attempts_at_once() -> None:
    with StubServer(default=StubReply.fail(429, "slow down", retry_after_ms=None)) as server:
        server.default.headers = {"retry-after": "30"}
        clock = FakeClock()
        s = summarizer(server.openai_base_url, deadline=10.0, retries=5, clock=clock, sleep=clock.sleep)
        with pytest.raises(SummarizerError, match=r"less than the 30\.0s wait"):
            s.summarize(span())
        assert server.calls == 1 and clock.slept == []


def test_a_short_retry_after_is_honoured_within_the_deadline() -> None:
    with StubServer([StubReply.fail(503, "busy", retry_after_ms=None), StubReply.ok(TEMPLATE)]) as server:
        server._script[0].headers = {"retry-after": "2"}
        clock = FakeClock()
        s = summarizer(server.openai_base_url, deadline=10.0, retries=2, clock=clock, sleep=clock.sleep)
        assert s.summarize(span()) == TEMPLATE.strip()
        assert clock.slept == [2.0] and server.calls == 2


def test_sdk_retries_are_off_so_attempts_are_counted_once() -> None:
    with StubServer(default=StubReply.fail(500)) as server:
        s = summarizer(server.openai_base_url, retries=2)
        with pytest.raises(SummarizerError):
            s.summarize(span())
        assert server.calls == 3  # 1 + 2 retries, not multiplied by the SDK's own retries


def test_repeated_failures_start_a_cooldown_then_a_probe() -> None:
    with StubServer(default=StubReply.fail(500)) as server:
        clock = FakeClock()
        s = summarizer(server.openai_base_url, retries=0, failure_threshold=2, cooldown=60.0, clock=clock, sleep=clock.sleep)
        for _ in range(2):
            with pytest.raises(SummarizerError, match="answered 500"):
                s.summarize(span())
        assert s.cooling_down and server.calls == 2
        with pytest.raises(SummarizerError, match="cooling down"):
            s.summarize(span())
        assert server.calls == 2  # skipped: no request
        clock.now += 61
        server.default = StubReply.ok(TEMPLATE)
        assert s.summarize(span()) == TEMPLATE.strip()  # the probe succeeds: cooldown over
        assert not s.cooling_down and server.calls == 3


def test_a_failed_probe_doubles_the_cooldown() -> None:
    with StubServer(default=StubReply.fail(500)) as server:
        clock = FakeClock()
        s = summarizer(server.openai_base_url, retries=0, failure_threshold=1, cooldown=10.0, clock=clock, sleep=clock.sleep)
        with pytest.raises(SummarizerError):
            s.summarize(span())
        clock.now += 11
        with pytest.raises(SummarizerError, match="answered 500"):
            s.summarize(span())  # the probe fails
        clock.now += 11
        with pytest.raises(SummarizerError, match="cooling down"):
            s.summarize(span())  # 20 s now


def test_a_reply_that_ignores_max_tokens_is_cut_to_it() -> None:
    huge = render_sections({"Goal": ["- goal"], "Progress/Done": [f"- step {i} " + "x" * 200 for i in range(20_000)]})
    with StubServer(default=StubReply.ok(huge)) as server:
        s = summarizer(server.openai_base_url)
        out = s.summarize(span(), budget_tokens=1_000)
        asked = server.requests[0].body["max_tokens"]
        assert estimate(huge) > 100 * asked
        assert has_template(out) and CUT_NOTE in out
        assert estimate(out) <= asked + 20 * estimate(CUT_NOTE)


@pytest.mark.parametrize(
    "fault",
    [
        StubReply(raw_body=b"{not json"),
        StubReply(raw_body=b'{"choices": "nope"}'),
        StubReply(raw_body=b"\xff\xfe binary"),
        StubReply(reset=True),
        StubReply.fail(502, "<html>" + "bad gateway " * 500 + "</html>"),
    ],
    ids=["malformed", "wrong-shape", "binary", "reset", "huge-html-error"],
)
def test_server_faults_are_summarizer_errors_never_crashes(fault: StubReply) -> None:
    with StubServer(default=fault) as server:
        s = summarizer(server.openai_base_url, retries=1)
        with pytest.raises(SummarizerError) as info:
            s.summarize(span())
        assert len(str(info.value)) < 1_000
        assert server.calls >= 1


def test_an_echoed_key_never_reaches_the_error_or_the_summary() -> None:
    with StubServer(default=StubReply(status=500, text=None, echo_auth=True)) as server:
        s = summarizer(server.openai_base_url, retries=0)
        with pytest.raises(SummarizerError) as info:
            s.summarize(span())
        assert KEY not in str(info.value) and MARK in str(info.value)
        assert info.value.__cause__ is None  # the SDK exception (raw body) is not chained
    with StubServer(default=StubReply.ok(TEMPLATE + f"\nthe key was {KEY}")) as server:
        out = summarizer(server.openai_base_url).summarize(span())
        assert KEY not in out and MARK in out


def test_anthropic_client_redacts_an_echoed_key_too() -> None:
    with StubServer(default=StubReply(status=401, text=None, echo_auth=True)) as server:
        client = AnthropicClient(base_url=server.anthropic_base_url, api_key=KEY, timeout=5)
        with pytest.raises(SummarizerAuthError) as info:
            client.complete([{"role": "user", "content": "hi"}], model="claude-x", max_tokens=10, timeout=5)
        assert KEY not in str(info.value)


@pytest.mark.parametrize("template", ["http://alice:hunter2pass@127.0.0.1:{port}/v1", "http://127.0.0.1:{port}/v1?key=qwerty12345"])
def test_credentials_in_base_url_never_reach_an_error(template: str) -> None:
    with StubServer(default=StubReply.fail(500, "boom")) as server:
        url = template.format(port=server.port)
        client = OpenAICompatClient(base_url=url, api_key=KEY, timeout=5)
        with pytest.raises(SummarizerError) as info:
            client.complete([{"role": "user", "content": "hi"}], model="m", max_tokens=10, timeout=5)
        text = str(info.value)
        assert "hunter2pass" not in text and "qwerty12345" not in text
    # an unreachable URL (connection refused) names the host, not the password
    client = OpenAICompatClient(base_url=template.format(port=1), api_key=KEY, timeout=1)
    with pytest.raises(SummarizerError) as info:
        client.complete([{"role": "user", "content": "hi"}], model="m", max_tokens=10, timeout=1)
    assert "hunter2pass" not in str(info.value) and "qwerty12345" not in str(info.value)


def test_a_lone_surrogate_in_a_reply_becomes_a_replacement_character() -> None:
    with StubServer(default=StubReply.ok(TEMPLATE + "\nbroken \ud800 text")) as server:
        out = summarizer(server.openai_base_url).summarize(span())
        out.encode("utf-8")  # encodable
        assert "\ufffd" in out


def test_content_redaction_is_opt_in() -> None:
    secret_span = [{"role": "user", "content": "use AKIAABCDEFGHIJKLMNOP and ghp_" + "a" * 36}]
    with StubServer(default=StubReply.ok(TEMPLATE)) as server:
        summarizer(server.openai_base_url).summarize(secret_span)
        summarizer(server.openai_base_url, redact_content=True).summarize(secret_span)
        plain, redacted = (r.prompt_text for r in server.requests)
        assert "AKIAABCDEFGHIJKLMNOP" in plain
        assert "AKIAABCDEFGHIJKLMNOP" not in redacted and "ghp_" not in redacted and MARK in redacted
    assert secret_span[0]["content"].startswith("use AKIA")  # the caller's data is untouched


# -- properties --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(body=st.text(min_size=0, max_size=3_000), budget=st.integers(min_value=1, max_value=400), templated=st.booleans())
def test_bound_summary_is_always_within_the_budget(body: str, budget: int, templated: bool) -> None:
    text = render_sections({"Goal": [body], "Critical Context": [body[::-1]]}) if templated else body
    out = bound_summary(text, budget)
    if estimate(text) <= budget:
        assert out == text
    else:
        assert estimate(out) <= budget + 12 * estimate(CUT_NOTE)


@settings(max_examples=60, deadline=None)
@given(before=st.text(max_size=200), after=st.text(max_size=200), secret=st.text(alphabet="abcdefXYZ0123456789-_", min_size=8, max_size=40))
def test_a_registered_secret_is_redacted_wherever_it_appears(before: str, after: str, secret: str) -> None:
    from ctxengine.redact import redact, register_secret

    register_secret(secret)
    assert secret not in redact(before + secret + after)
    clear_secrets()


def test_error_text_is_json_safe_for_the_store() -> None:
    # a report note carrying a redacted error serialises like any other
    assert json.loads(json.dumps({"note": f"{MARK} answered 500"}))["note"].startswith(MARK)


def test_the_cooldown_is_shared_by_every_summarizer_of_an_endpoint() -> None:
    # two sessions (two engines, two summarizers) against one dead server: the second waits for nothing
    with StubServer(default=StubReply.fail(500)) as server:
        clock = FakeClock()
        first = summarizer(server.openai_base_url, retries=0, failure_threshold=1, cooldown=60.0, clock=clock, sleep=clock.sleep)
        second = summarizer(server.openai_base_url, retries=0, failure_threshold=1, cooldown=60.0, clock=clock, sleep=clock.sleep)
        with pytest.raises(SummarizerError, match="answered 500"):
            first.summarize(span())
        with pytest.raises(SummarizerError, match="cooling down"):
            second.summarize(span())
        assert server.calls == 1 and second.cooling_down


def test_an_engine_holding_the_summarizer_can_be_deep_copied() -> None:
    import copy

    from ctxengine.engines.compressor import ContextCompressor

    with StubServer(default=StubReply.ok(TEMPLATE)) as server:
        s = summarizer(server.openai_base_url)
        s.summarize(span())  # connections open, state set
        engine = ContextCompressor(context_length=8_000, summarizer=s)
        clone = copy.deepcopy(engine)
        assert clone.summarizer is s


# -- the deadline over any sequence of faults (the chat-client seam faked in memory) --------------------

reply = st.one_of(
    st.tuples(st.just("ok"), st.sampled_from([TEMPLATE, "", "prose without headings", TEMPLATE * 400])),
    st.tuples(st.just("error"), st.booleans(), st.one_of(st.none(), st.floats(min_value=0, max_value=120))),
    st.tuples(st.just("slow"), st.floats(min_value=0, max_value=200)),
)


class ScriptedClient:
    """A ChatClient that replays ``script`` on a fake clock (a call honours its timeout)."""

    def __init__(self, script: list[tuple[object, ...]], clock: FakeClock) -> None:
        self.script = list(script)
        self.clock = clock
        self.calls = 0

    def complete(self, messages: object, *, model: str, max_tokens: int, timeout: float) -> str:
        self.calls += 1
        step = self.script.pop(0) if self.script else ("ok", TEMPLATE)
        if step[0] == "ok":
            return str(step[1])
        if step[0] == "error":
            raise SummarizerError("scripted failure", retryable=bool(step[1]), retry_after=step[2])  # type: ignore[arg-type]
        seconds = float(step[1])  # type: ignore[arg-type]
        if seconds > timeout:
            self.clock.now += timeout
            raise SummarizerError(f"timed out after {timeout:g}s")
        self.clock.now += seconds
        return TEMPLATE


@settings(max_examples=200, deadline=None)
@given(script=st.lists(reply, max_size=8), deadline=st.floats(min_value=1, max_value=120), timeout=st.floats(min_value=0.5, max_value=60), retries=st.integers(0, 5))
def test_one_summary_never_outlives_its_deadline(script: list[tuple[object, ...]], deadline: float, timeout: float, retries: int) -> None:
    clock = FakeClock()
    client = ScriptedClient(script, clock)
    s = LlmSummarizer(client, f"m-{id(client)}", context_length=64_000, timeout=timeout, deadline=deadline, retries=retries, clock=clock, sleep=clock.sleep)
    start = clock.now
    try:
        out = s.summarize(span(), budget_tokens=500)
    except SummarizerError:
        pass
    else:
        assert has_template(out) and estimate(out) <= s._max_tokens(500) + 12 * estimate(CUT_NOTE)
    assert clock.now - start <= deadline + 1e-6
    assert client.calls <= 1 + retries


def test_a_summary_whose_call_was_abandoned_opens_the_cooldown_at_once() -> None:
    # a trickling server costs every compaction its full timeout: the next one in the same
    # prepare (failure_threshold 2) must not pay it again
    with StubServer(default=StubReply(text=TEMPLATE, trickle=0.5)) as server:
        client = OpenAICompatClient(base_url=server.openai_base_url, api_key=KEY, timeout=0.4)
        s = LlmSummarizer(client, f"stub-{id(client)}", context_length=16_000, timeout=0.4, deadline=60.0, retries=0, failure_threshold=2, cooldown=60.0)
        client._client()  # the SDK's import is not what is measured
        with pytest.raises(SummarizerError, match="timeout"):
            s.summarize(span())
        assert s.cooling_down
        with pytest.raises(SummarizerError, match="cooling down"):
            s.summarize(span())
        assert s.abandoned == 1 and server.calls <= 1  # the second summary asked nothing
