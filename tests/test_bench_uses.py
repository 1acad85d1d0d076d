"""The needed-context measure (ctxengine.bench.uses) and the digest's names (kit.names): what
the agent used next was in view, and what a digest keeps is what it picks up again."""

from __future__ import annotations

import json
from pathlib import Path

from ctxengine.bench.runner import run_bench
from ctxengine.bench.uses import BUCKETS, InView, bucket, identifiers, session_uses
from ctxengine.engines.kit.digest import digest
from ctxengine.engines.kit.names import ranked_names
from ctxengine.io import Session, read_sessions
from ctxengine.messages import Message


def _call(i: int, name: str, args: dict[str, str], content: str | None = None) -> Message:
    return {"role": "assistant", "content": content, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def _airline() -> list[Message]:
    user = json.dumps({"user_id": "sofia_kim_7287", "payment_methods": {"credit_card_2198526": {"source": "credit_card"}, "certificate_8544743": {"amount": 250}}, "reservations": ["ZFA04Y"]})
    return [
        {"role": "system", "content": "You are an airline agent. Policy: ids look like user_XXXX_1234."},
        {"role": "user", "content": "Hi, I'm sofia_kim_7287 and want to change reservation ZFA04Y to 2024-05-27."},
        _call(0, "get_user_details", {"user_id": "sofia_kim_7287"}),
        {"role": "tool", "tool_call_id": "c0", "content": user},
        _call(1, "get_reservation_details", {"reservation_id": "ZFA04Y"}),
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"flights": [{"flight_number": "HAT170", "date": "2024-05-20"}]})},
        {"role": "assistant", "content": "Which card should I charge?"},
        {"role": "user", "content": "the card please"},
        _call(2, "update_reservation_flights", {"reservation_id": "ZFA04Y", "payment_id": "credit_card_2198526", "flight": "HAT170", "note": "brandnewtoken_999"}),
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "assistant", "content": "Done."},
    ]


def test_identifiers_are_what_an_agent_copies() -> None:
    found = identifiers('paid with credit_card_2198526 on 2024-05-17 for $1,234.50; see src/main/App.java and constructType() at https://x.example/a. "quoted span here" `TypeFactory.java` HAT170 the and of')
    assert {"credit_card_2198526", "2024-05-17", "1,234.50", "src/main/App.java", "constructType", "https://x.example/a", "quoted span here", "TypeFactory.java", "HAT170"} <= found
    assert not {"the", "and", "of", "paid"} & found


def test_session_uses_counts_what_was_learned_earlier_with_its_distance() -> None:
    uses = session_uses(_airline())
    assert len(uses) == 5  # one entry per recorded assistant message
    last = dict(uses[3].uses)
    # learned from the user (before call 0) and from outputs; the invented token and the
    # system prompt's words are not uses
    assert last["ZFA04Y"] == 3  # its newest source is call 0's output (the user named it before)
    assert "credit_card_2198526" in last and "HAT170" in last
    assert "brandnewtoken_999" not in last
    assert all(not ident.startswith("user_XXXX") for ident in last)
    assert last["HAT170"] == 2 and last["credit_card_2198526"] == 3
    assert bucket(1) == BUCKETS[0] and bucket(3) == "2-3" and bucket(10) == "4-10" and bucket(11) == ">10"


def test_in_view_counts_a_use_only_when_the_request_holds_it_verbatim() -> None:
    msgs = _airline()
    uses = session_uses(msgs)
    full, cut = InView(), InView()
    request = msgs[:8]
    full.check(3, uses[3], request)
    folded: list[Message] = [*msgs[:2], {"role": "assistant", "content": "[ctxengine:digest] get_user_details: sofia_kim_7287"}, *msgs[6:8]]
    cut.check(3, uses[3], folded)
    assert full.share() == 1.0
    assert cut.share() < 1.0 and any("credit_card_2198526" in m for m in cut.missed)
    d = cut.to_dict()
    assert d["uses"] == sum(v["uses"] for v in d["by_distance"].values()) and 0 <= d["in_view"] < 1


def test_the_bench_reports_in_view_beside_cost(tau_file: Path) -> None:
    sessions = [Session(s.id, s.messages, s.meta) for s in read_sessions(tau_file)[:2]]
    result = run_bench(sessions, ["cacheaware"], context_length=32_000)
    d = result.to_dict()
    none = d["engines"]["none"]
    assert none["in_view"] == 1.0 and none["in_view_uses"] > 0 and set(none["in_view_by_distance"]) == set(BUCKETS)
    assert "in_view_over_10_back" in d["engines"]["cacheaware"] and "sessions_compacted" in d["engines"]["cacheaware"]
    assert all("in_view" in r for r in d["runs"])


def test_a_digest_keeps_the_names_an_agent_picks_up_again() -> None:
    msgs = _airline()[2:6]
    listing = "Found 5 matches:\n/repo/src/A.java (2 matches)\n/repo/src/B.java (1 matches)\n/repo/src/C.java\n/repo/src/D.java\n/repo/src/E.java"
    view = "1: public class TypeFactory {\n2:   public JavaType constructType(Type t) {\n3:     return defaultInstance();\n4:   }\n5: }"
    span = [*msgs, _call(5, "bash", {"command": "search_dir foo"}), {"role": "tool", "tool_call_id": "c5", "content": listing}, _call(6, "bash", {"command": "open TypeFactory.java"}), {"role": "tool", "tool_call_id": "c6", "content": view}]
    ranked = ranked_names(span)
    assert {"credit_card_2198526", "certificate_8544743", "HAT170", "constructType", "defaultInstance"} <= set(ranked)
    assert "public" not in ranked and "return" not in ranked
    # the names the agent wrote itself rank first
    assert ranked.index("sofia_kim_7287") < ranked.index("payment_methods")
    text = digest(span, budget_tokens=300, fact_tokens=60, name_tokens=80)
    names_line = next(line for line in text.splitlines() if line.startswith("Names: "))
    assert "credit_card_2198526" in names_line and "constructType" in names_line
    assert all(f"/repo/src/{c}.java" in text for c in "ABCDE"), "every hit of a short listing"
    assert "Names:" not in digest(span, budget_tokens=300, fact_tokens=60, name_tokens=0)


def test_a_digest_folded_again_passes_its_names_on() -> None:
    first = digest(_airline()[2:6], budget_tokens=300, fact_tokens=60, name_tokens=80)
    assert "credit_card_2198526" in first
    earlier: Message = {"role": "assistant", "content": "[ctxengine:digest ref=abc: 4 earlier messages folded]\n" + first}
    later = [_call(7, "bash", {"command": "ls"}), {"role": "tool", "tool_call_id": "c7", "content": "README.md\nsetup.py"}]
    again = digest([earlier, *later], budget_tokens=300, fact_tokens=60, name_tokens=80)
    names_line = next(line for line in again.splitlines() if line.startswith("Names: "))
    assert "credit_card_2198526" in names_line and "setup.py" in names_line
