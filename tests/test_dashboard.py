"""The dashboard (``/ui`` of ``ctxengine proxy``, and ``ctxengine ui``) over a session a real
proxy recorded: a real proxy in front of the stub upstream, a real SQLite store, pages read over
HTTP and in a real headless Chromium (skipped, with the reason, when the system has none)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from ctxengine.config import Config
from ctxengine.proxy import SESSION_HEADER, TOKEN_HEADER, ProxyServer
from ctxengine.store import SqliteStore
from ctxengine.testing.stub_server import StubReply, StubServer
from ctxengine.ui import data

KEY = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
CLIENT_KEY = "sk-test-" + "0123456789abcdefXYZ"
SESSION = "build-fix"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
TURNS = 24


def _config(stub: StubServer, path: Path, **proxy: Any) -> Config:
    return Config().with_overrides(
        proxy={"openai_base_url": stub.openai_base_url, "anthropic_base_url": stub.anthropic_base_url, **proxy},
        store={"path": str(path)},
        context={"engine": "compressor"},
        model={"context_length": 6000},
    )


def _drive(p: ProxyServer, turns: int = TURNS) -> None:
    """An agent's session whose messages carry a key, long enough to compact."""
    c = openai.OpenAI(base_url=p.openai_base_url, api_key=CLIENT_KEY, max_retries=0, default_headers={SESSION_HEADER: SESSION, "user-agent": "demo-agent/1.0"})
    msgs: list[Any] = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": f"fix the failing build; the deploy key is {KEY}"}]
    for turn in range(turns):
        out = f"turn {turn}: src/app/mod{turn}.py\n" + ("log line with details about the build\n" * 30)
        if turn == 3:
            out += f"export OPENAI_API_KEY={KEY}\nError: connection refused at https://ci.example.com/job/42\n"
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{turn}.txt"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"call_{turn}", "content": out}]
        r = c.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        msgs.append({"role": "user", "content": f"continue {turn}"})


def _settled(store_path: Path, n: int) -> None:
    with SqliteStore(store_path) as store:
        deadline = time.monotonic() + 10
        while store.usage()[0].requests < n and time.monotonic() < deadline:
            time.sleep(0.02)


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer() as s:
        s.responder = lambda req: StubReply.ok("ack " + "z" * 40)
        yield s


@pytest.fixture(scope="module")
def proxy(stub: StubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    path = tmp_path_factory.mktemp("dash") / "sessions.db"
    with ProxyServer(_config(stub, path)) as p:
        _drive(p)
        _settled(path, TURNS)
        yield p


def _store(p: ProxyServer) -> SqliteStore:
    return SqliteStore(str(p.proxy.config.store.path))


@functools.cache
def _client() -> httpx.Client:
    return httpx.Client(timeout=10)  # one for the module: making a client costs a quarter second


def _get(p: ProxyServer, path: str, **kw: Any) -> httpx.Response:
    return _client().get(p.url + path, **kw)


def _pages(p: ProxyServer) -> dict[str, str]:
    """Every page of the session: overview, sessions, the session, each audit, each original,
    a search; path → HTML."""
    with _store(p) as store:
        comps = store.compactions(SESSION)
        audits = [data.audit(store, c.id) for c in comps]
    paths = ["/ui/", "/ui/sessions", f"/ui/sessions/{SESSION}", f"/ui/sessions/{SESSION}?q=OPENAI_API_KEY", f"/ui/sessions/{SESSION}?q=deploy"]
    paths += [f"/ui/sessions/{SESSION}/compactions/{c.id}" for c in comps]
    paths += [f"/ui/sessions/{SESSION}/expand/{r['id']}" for a in audits for r in a["removed"]]
    paths += ["/ui/api/overview", "/ui/api/sessions", f"/ui/api/sessions/{SESSION}"]
    out = {}
    for path in paths:
        r = _get(p, path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        out[path] = r.text
    return out


# -- the request log --------------------------------------------------------------------------------
def test_the_proxy_logs_each_request_with_its_usage(proxy: ProxyServer) -> None:
    with _store(proxy) as store:
        rows = store.requests(SESSION)
    assert len(rows) == TURNS
    assert all(r.client == "demo-agent" and r.model == "gpt-4o" and r.outcome == "ok" and r.status == 200 for r in rows)
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in rows)  # the stub's usage
    assert rows[-1].tokens_in > rows[-1].tokens_out  # compacted: less went upstream than came in
    assert sum(r.compactions for r in rows) >= 1


# -- pages over HTTP -----------------------------------------------------------------------------------
def test_every_page_renders_and_shows_the_figures(proxy: ProxyServer) -> None:
    pages = _pages(proxy)
    overview = pages["/ui/"]
    assert "Tokens saved" in overview and "gpt-4o" in overview and "demo-agent" in overview and "<svg" in overview
    assert "Prices: genai-prices" in overview
    assert SESSION in pages["/ui/sessions"]
    assert "Each request" in pages[f"/ui/sessions/{SESSION}"] and "cacheaware" in pages[f"/ui/sessions/{SESSION}"]
    assert 'id="hits"' in pages[f"/ui/sessions/{SESSION}?q=deploy"] and "No match" not in pages[f"/ui/sessions/{SESSION}?q=deploy"]
    api = json.loads(pages["/ui/api/overview"])
    assert api["totals"]["requests"] == TURNS and api["totals"]["saved_tokens"] > 0 and api["totals"]["saved"] > 0


def test_no_page_shows_a_key_the_messages_carry(proxy: ProxyServer) -> None:
    with _store(proxy) as store:
        assert any(KEY in json.dumps(m) for m in store.originals(SESSION))  # the store has it
    for path, html in _pages(proxy).items():
        assert KEY not in html, path
        assert CLIENT_KEY not in html, path


def test_a_compactions_audit_lists_every_message_it_removed(proxy: ProxyServer) -> None:
    with _store(proxy) as store:
        comps = store.compactions(SESSION)
        assert comps
        for c in comps:
            a = data.audit(store, c.id)
            before = store.history(SESSION, f"before:{c.id}")
            after = [json.dumps(m, sort_keys=True) for m in store.history(SESSION, f"after:{c.id}")]
            listed = {r["position"] for r in a["removed"]}
            gone = {i for i, m in enumerate(before) if json.dumps(m, sort_keys=True) not in after}
            assert gone <= listed  # 100 % of the messages it removed
            assert set(c.replaced) <= {r["id"] for r in a["removed"]}  # and every one the engine reported
            assert len(listed) < len(before)  # unchanged messages (new ids after an edit) are not listed
            assert all(r["role"] and r["tokens"] > 0 for r in a["removed"])
            assert a["stand_ins"]
        first = data.audit(store, comps[0].id)
    html = _get(proxy, f"/ui/sessions/{SESSION}/compactions/{comps[0].id}").text
    assert html.count('class="original"') == len(first["removed"])
    kinds = {s["kind"] for s in first["stand_ins"]}
    assert kinds and all(k in html for k in kinds)
    for s in first["stand_ins"]:  # a cut marker's originals: what ctx_expand returns for its ref
        if s["ref"]:
            assert "What ctx_expand returns: 1 message(s)" in _get(proxy, f"/ui/sessions/{SESSION}/expand/{s['ref']}").text


def test_the_original_is_what_ctx_expand_returns(proxy: ProxyServer) -> None:
    with _store(proxy) as store:
        c = store.compactions(SESSION)[0]
        removed = data.audit(store, c.id)["removed"][0]
    html = _get(proxy, f"/ui/sessions/{SESSION}/expand/{removed['id']}").text
    assert "What ctx_expand returns: 1 message(s)" in html and removed["id"] in html


def test_missing_sessions_and_compactions_are_404_pages(proxy: ProxyServer) -> None:
    with _store(proxy) as store:
        cid = store.compactions(SESSION)[0].id
    for path in ["/ui/sessions/no-such-session", f"/ui/sessions/no-such-session/compactions/{cid}", f"/ui/sessions/{SESSION}/compactions/0123456789abcdef",
                 "/ui/api/sessions/no-such-session"]:
        r = _get(proxy, path)
        assert r.status_code == 404, path
        assert "no-such-session" in r.text or "0123456789abcdef" in r.text
    assert "404 · Not found" in _get(proxy, "/ui/sessions/no-such-session").text
    assert _get(proxy, "/ui", follow_redirects=True).url.path == "/ui/"


def test_a_store_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from ctxengine.ui.app import Dashboard

    path = tmp_path / "s.db"
    store = SqliteStore(str(path))
    store.close()  # every read now fails
    with TestClient(Dashboard(store).app) as client:
        r = client.get("/ui/")
    assert r.status_code == 503 and "The store cannot be read" in r.text
    with TestClient(Dashboard(None).app) as client:
        r = client.get("/ui/sessions")
    assert r.status_code == 503 and "no session store is configured" in r.text


def test_the_dashboard_needs_the_token_when_the_proxy_has_one(stub: StubServer, tmp_path: Path) -> None:
    token = "tok-" + "9" * 20
    with ProxyServer(_config(stub, tmp_path / "s.db"), auth_token=token) as p:
        for path in ["/ui/", "/ui/sessions", "/ui/api/overview", "/ui/static/ui.css"]:
            assert _get(p, path).status_code == 401, path
        assert _get(p, "/ui/", headers={TOKEN_HEADER: "wrong"}).status_code == 401
        assert _get(p, "/ui/", headers={TOKEN_HEADER: token}).status_code == 200
        with httpx.Client(base_url=p.url, follow_redirects=True) as client:
            r = client.get(f"/ui/sessions?token={token}")  # once in the address: a cookie after that
            assert r.status_code == 200 and r.url.path == "/ui/sessions" and "token" not in str(r.url)
            assert client.get("/ui/").status_code == 200


# -- in a real browser ------------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this system (apt-get install chromium): the pages are not driven in a browser")


def _chromium(*args: str) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _dom(url: str) -> str:
    """The page's DOM once loaded and its scripts ran."""
    return _chromium("--virtual-time-budget=3000", "--dump-dom", url)


@browser
def test_the_browser_loads_each_page_opens_an_audit_and_searches(proxy: ProxyServer) -> None:
    overview = _dom(proxy.url + "/ui/")
    assert "Tokens saved" in overview and "live · " in overview  # the script polled the JSON endpoint
    sessions = _dom(proxy.url + "/ui/sessions")
    assert f">{SESSION}</a>" in sessions
    session = _dom(proxy.url + f"/ui/sessions/{SESSION}")
    link = re.search(r'href="(/ui/sessions/[^"]+/compactions/[0-9a-f]+)"', session)
    assert link, "the session page links each compaction's audit"
    audit = _dom(proxy.url + link.group(1))
    assert "Removed or changed" in audit and "In their place" in audit
    n = int(re.search(r'id="removed-count">(\d+)<', audit).group(1))  # type: ignore[union-attr]
    assert n >= 1 and audit.count('class="original"') == n
    original = re.search(r'class="original" href="([^"]+)"', audit)
    assert original and "What ctx_expand returns" in _dom(proxy.url + original.group(1).replace("&amp;", "&"))
    found = _dom(proxy.url + f"/ui/sessions/{SESSION}?q=connection+refused")
    assert 'id="hits"' in found and "connection refused" in found
    for html in (overview, sessions, session, audit, found):
        assert KEY not in html


@browser
def test_the_browser_gets_401_without_the_token_and_the_page_with_it(stub: StubServer, tmp_path: Path) -> None:
    token = "tok-" + "7" * 20
    with ProxyServer(_config(stub, tmp_path / "s.db"), auth_token=token) as p:
        assert "401 · Unauthorized" in _dom(p.url + "/ui/")
        page = _dom(p.url + f"/ui/?token={token}")
        assert "Tokens saved" in page and "Unauthorized" not in page
        assert "404 · Not found" in _dom(p.url + f"/ui/sessions/nope?token={token}")


@browser
def test_a_screenshot_of_the_overview(proxy: ProxyServer, tmp_path: Path) -> None:
    shot = tmp_path / "overview.png"
    _chromium("--window-size=1280,900", f"--screenshot={shot}", proxy.url + "/ui/")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # a page drawn, not a blank one


# -- the terminal -------------------------------------------------------------------------------------------
def test_stats_and_the_audit_in_the_terminal(proxy: ProxyServer) -> None:
    from click.testing import CliRunner

    from ctxengine.cli.main import cli

    path = str(proxy.proxy.config.store.path)
    out = CliRunner().invoke(cli, ["stats", "--store", path])
    assert out.exit_code == 0, out.output
    assert f"{TURNS} requests in 1 sessions" in out.output and "gpt-4o" in out.output and "% saved" in out.output and "█" in out.output
    assert "demo-agent" in out.output and "prices: genai-prices" in out.output
    as_json = json.loads(CliRunner().invoke(cli, ["stats", "--store", path, "--json"]).output)
    assert as_json["totals"]["requests"] == TURNS
    bad = CliRunner().invoke(cli, ["stats", "--store", path, "--since", "yesterday"])
    assert bad.exit_code == 2 and "30m, 24h, 7d" in bad.output
    with _store(proxy) as store:
        c = store.compactions(SESSION)[0]
        n = len(data.audit(store, c.id)["removed"])
    out = CliRunner().invoke(cli, ["sessions", "audit", SESSION, c.id[:10], "--store", path])
    assert out.exit_code == 0, out.output
    assert f"removed or changed ({n}):" in out.output and "in their place" in out.output and "[cut marker]" in out.output
    assert KEY not in CliRunner().invoke(cli, ["sessions", "audit", SESSION, "--store", path, "--full"]).output
    missing = CliRunner().invoke(cli, ["sessions", "audit", SESSION, "ffff", "--store", path])
    assert missing.exit_code == 2 and "no compaction 'ffff'" in missing.output


# -- shadow mode ---------------------------------------------------------------------------------------------
def test_shadow_mode_forwards_unchanged_and_logs_what_would_have_gone(tmp_path: Path) -> None:
    path = tmp_path / "shadow.db"
    with StubServer() as stub:
        stub.responder = lambda req: StubReply.ok("ack " + "z" * 40)
        with ProxyServer(_config(stub, path, shadow=True)) as p:
            _drive(p)
            _settled(path, TURNS)
            sent = [r.body for r in stub.requests]
    assert len(sent) == TURNS
    last = sent[-1]
    assert "tools" in last and [t["function"]["name"] for t in last["tools"]] == ["read_file"]  # no recall tool added
    assert all("[ctxengine:" not in json.dumps(b) for b in sent)  # nothing compacted went upstream
    assert len(last["messages"]) == 2 + 4 * TURNS - 2  # the client's whole history, as sent
    with SqliteStore(str(path)) as store:
        rows = store.requests(SESSION)
        assert len(rows) == TURNS and all(r.shadow for r in rows)
        assert rows[-1].tokens_out < rows[-1].tokens_in  # what ctxengine would have sent
        assert rows[-1].prompt_tokens > 0  # the usage of what was really sent
        assert store.compactions(SESSION)  # the compactions it would have run, recorded for the audit
        d = data.overview(store)
    assert d["totals"]["shadow"] == TURNS and d["totals"]["saved_tokens"] > 0


def test_the_ui_command_refuses_to_bind_beyond_loopback_without_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from ctxengine.cli.main import cli

    monkeypatch.delenv("CTXENGINE_PROXY_TOKEN", raising=False)
    out = CliRunner().invoke(cli, ["ui", "--store", str(tmp_path / "s.db"), "--host", "0.0.0.0"])
    assert out.exit_code == 2 and "requires a proxy token" in out.output


def test_an_lcm_summary_is_audited_with_its_originals_one_click_away(tmp_path: Path) -> None:
    from ctxengine.manager import ContextManager

    store = SqliteStore(str(tmp_path / "s.db"))
    mgr = ContextManager(Config().with_overrides(context={"engine": "lcm"}, model={"context_length": 6000}), model="gpt-4o", store=store)
    msgs: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix the build"}]
    for t in range(30):
        call = {"id": f"c{t}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"log{t}.txt"})}}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": f"c{t}", "content": f"turn {t}: " + "log line with details about the build\n" * 30}]
        mgr.prepare(msgs, session_id="L")
        msgs += [{"role": "assistant", "content": "ack"}, {"role": "user", "content": f"continue {t}"}]
    lcm = [c for c in store.compactions("L") if c.engine == "lcm"]
    assert lcm
    a = data.audit(store, lcm[0].id)
    [summary] = [s for s in a["stand_ins"] if s["kind"] == "summary"]
    assert summary["ref"] and len(a["removed"]) >= len(lcm[0].replaced)
    assert data.expand(store, "L", summary["ref"])["total"] == len(a["removed"])  # the originals behind it
    store.close()


@browser
def test_the_browser_sorts_and_filters_the_sessions_table(tmp_path: Path) -> None:
    from ctxengine.store import RequestRecord

    store = SqliteStore(str(tmp_path / "s.db"))
    for sid, client, turns in (("alpha", "aider", 5), ("beta", "claude-cli", 9), ("gamma", "aider", 2)):
        store.record_messages(sid, [{"role": "user", "content": f"hello {sid}"}])
        for t in range(turns):
            store.record_request(RequestRecord(sid, "openai", "gpt-4o", client=client, tokens_in=100 * (t + 1), tokens_out=80 * (t + 1)))
    with ProxyServer(Config(), store=store) as p:
        dom = _dom(p.url + "/ui/sessions#filter=aider&sort=3&dir=-1")  # column 3: turns, most first
    rows = re.findall(r'<tr data-text="([a-z]+) [^"]*"( style="display: none;")?>', dom)
    assert [sid for sid, hidden in rows if not hidden] == ["alpha", "gamma"]  # aider's, by turns
    assert [sid for sid, hidden in rows if hidden] == ["beta"]
    assert 'class="num desc"' in dom  # the sorted column says so
    store.close()
