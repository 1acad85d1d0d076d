"""The kit's one head/tail cut: budget held, marker names the ref, facts of the middle kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxengine.engines.kit import cut_output, parse_header, split_facts_block
from ctxengine.facts import error_lines, paths_in, urls_in
from ctxengine.tokens import ExactCounter, estimate


def listing(n: int) -> str:
    lines = [f"drwxr-xr-x 2 root root 4096 /srv/app/module{i}/src/File{i}.java" for i in range(n)]
    lines[n // 2] = "ERROR: cannot open /srv/app/broken/Thing.java: Permission denied"
    lines[n // 3] = "see https://example.org/docs/page for details"
    return "\n".join(lines)


def test_text_that_fits_is_returned_unchanged() -> None:
    text = "one\ntwo\nthree"
    assert cut_output(text, budget_tokens=100) is text


def test_cut_holds_the_budget_and_keeps_both_ends() -> None:
    text = listing(2000)
    out = cut_output(text, budget_tokens=800, ref="r1")
    assert estimate(out) <= 800
    first, *_ = out.split("\n")
    marker = parse_header(first)
    assert marker is not None and marker.kind == "cut" and marker.ref == "r1"
    assert "ctx_expand ref=r1" in first
    lines = text.split("\n")
    assert lines[0] in out and lines[-1] in out


def test_errors_and_urls_of_the_removed_middle_are_listed_first() -> None:
    text = listing(2000)
    out = cut_output(text, budget_tokens=600, ref="abc")
    _, facts = split_facts_block(out)
    assert "ERROR: cannot open /srv/app/broken/Thing.java: Permission denied" in facts.errors
    assert "https://example.org/docs/page" in facts.urls
    # paths listed verbatim, as many as the budget allowed; the marker counts the rest
    assert facts.paths and all(p in paths_in(text) for p in facts.paths)
    assert "more facts not listed" in out.split("\n")[0]


def test_every_fact_listed_when_the_budget_allows() -> None:
    text = listing(60)
    budget = estimate(text) - 50
    out = cut_output(text, budget_tokens=budget)
    assert estimate(out) <= budget
    for fact in [*paths_in(text), *urls_in(text), *error_lines(text)]:
        assert fact in out
    assert "not listed" not in out


def test_exact_counter_budget_held() -> None:
    counter = ExactCounter()
    text = listing(1500)
    out = cut_output(text, budget_tokens=500, ref="x", counter=counter)
    assert counter.count(out) <= 500


def test_head_and_tail_caps() -> None:
    text = "\n".join(f"line {i}" for i in range(500))
    out = cut_output(text, budget_tokens=200, head_lines=3, tail_lines=2)
    body = out.split("\n")[1:]
    assert body == ["line 0", "line 1", "line 2", "line 498", "line 499"]
    assert "495 of 500 lines removed after line 3" in out


def test_a_giant_single_line_is_capped() -> None:
    text = "x" * 200_000
    out = cut_output(text, budget_tokens=300)
    assert estimate(out) <= 300
    assert "…[+199760 chars]" in out


def test_budget_below_the_marker_gives_the_marker_alone() -> None:
    out = cut_output(listing(100), budget_tokens=3, ref="z")
    assert out.startswith("[ctxengine:cut ref=z:") and "\n" not in out


def test_deterministic() -> None:
    text = listing(900)
    assert cut_output(text, budget_tokens=700, ref="q") == cut_output(text, budget_tokens=700, ref="q")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="budget_tokens"):
        cut_output("abc", budget_tokens=-1)
    with pytest.raises(ValueError, match="str"):
        cut_output(b"abc", budget_tokens=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ref"):
        cut_output("a\n" * 1000, budget_tokens=10, ref="has space")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120), min_size=1, max_size=80),
    st.integers(min_value=0, max_value=400),
)
def test_budget_held_on_any_text(lines: list[str], budget: int) -> None:
    text = "\n".join(lines)
    out = cut_output(text, budget_tokens=budget, ref="p")
    if estimate(text) <= budget:
        assert out == text
    else:
        # within the budget, or (a budget below the marker) the shorter of marker and text
        assert estimate(out) <= budget or out == text or "\n" not in out
        assert out.startswith("[ctxengine:cut ref=p:") or out == text


def test_a_memo_gives_the_same_cut() -> None:
    from ctxengine.facts import FactMemo

    text = "\n".join(f"line {i} src/mod{i}/file{i}.py Error: failed at step {i}" for i in range(300))
    memo = FactMemo()
    plain = cut_output(text, budget_tokens=200, ref="r1")
    assert cut_output(text, budget_tokens=200, ref="r1", memo=memo) == plain
    assert cut_output(text, budget_tokens=200, ref="r1", memo=memo) == plain  # from the memo


def test_without_recall_the_marker_names_no_tool_and_says_where_the_original_is() -> None:
    from ctxengine.engines.kit import RecallReach, recall_pointer

    text = "\n".join(f"line {i} of src/pkg/mod{i}.py" for i in range(400))
    with_tools = cut_output(text, budget_tokens=200, ref="abc")
    without = cut_output(text, budget_tokens=200, ref="abc", recall=False)
    assert "ctx_expand ref=abc" in with_tools.splitlines()[0]
    first = without.splitlines()[0]
    assert "ctx_" not in without and "ref=abc" in first and "kept verbatim in the session store" in first
    assert estimate(without) <= 200
    assert parse_header(without) is not None and parse_header(without).ref == "abc"  # type: ignore[union-attr]
    # the one owner of the wording
    assert recall_pointer(None, "r1") == recall_pointer(RecallReach(), "r1") == "ctx_expand ref=r1"
    assert recall_pointer(RecallReach(tools=False), "r1") == recall_pointer(False) == "kept verbatim in the session store"
    assert "ctx_grep" in recall_pointer(True)
