"""``ctxengine sessions list|show|search|export|restore``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ctxengine.cli.main import cli
from ctxengine.store import SqliteStore


def _msgs(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(n):
        out += [{"role": "user", "content": f"question {i} about src/app/mod{i}.py"}, {"role": "assistant", "content": f"answer {i}"}]
    return out


@pytest.fixture
def populated(tmp_path: Path) -> tuple[str, str]:
    path = str(tmp_path / "s.db")
    store = SqliteStore(path)
    msgs = _msgs(4)
    store.record_messages("alpha", msgs)
    after = [msgs[0], {"role": "user", "content": "[ctxengine:lcm node=ab depth=0] folded"}, *msgs[5:]]
    cid = store.record_compaction("alpha", {"engine": "lcm", "tokens_before": 400, "tokens_after": 100, "replaced": [1, 2, 3, 4]}, msgs, after)
    store.record_messages("beta", _msgs(1))
    store.close()
    return path, cid


def run(*args: str, input: str | None = None) -> Any:
    result = CliRunner().invoke(cli, list(args), input=input)
    return result


def test_list_shows_a_table(populated: tuple[str, str]) -> None:
    path, _ = populated
    r = run("sessions", "list", "--store", path)
    assert r.exit_code == 0, r.stdout
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["session", "messages", "stored", "compactions", "updated", "(UTC)"]
    assert set(lines[1]) <= {"-", " "}
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert rows["alpha"][1:4] == ["6", "14", "1"]
    assert rows["beta"][1:4] == ["3", "3", "0"]
    data = json.loads(run("sessions", "list", "--store", path, "--json").stdout)
    assert {d["id"] for d in data} == {"alpha", "beta"}


def test_show_lists_events_compactions_and_history(populated: tuple[str, str]) -> None:
    path, cid = populated
    r = run("sessions", "show", "alpha", "--store", path)
    assert r.exit_code == 0, r.stdout
    assert "session alpha: 6 messages in the current history, 14 stored, 1 compaction(s)" in r.stdout
    assert cid in r.stdout and "75.0%" in r.stdout
    assert "compaction" in r.stdout and "[ctxengine:lcm node=ab depth=0] folded" in r.stdout
    r2 = run("sessions", "show", "alpha", "--store", path, "--at", f"before:{cid}")
    assert "question 0 about src/app/mod0.py" in r2.stdout


def test_search_scoped_and_global(populated: tuple[str, str]) -> None:
    path, _ = populated
    r = run("sessions", "search", "question 0", "--store", path)
    assert r.exit_code == 0
    assert "alpha,beta" in r.stdout or ("alpha" in r.stdout and "beta" in r.stdout)
    hits = json.loads(run("sessions", "search", "mod3.py", "--store", path, "--session", "alpha", "--json").stdout)
    assert [h["snippet"] for h in hits] == ["question 3 about src/app/mod3.py"]
    assert "no match" in run("sessions", "search", "zzz-nothing", "--store", path).stdout
    rx = json.loads(run("sessions", "search", r"answer [0-2]$", "--regex", "--store", path, "--json", "--session", "alpha").stdout)
    assert sorted(h["snippet"] for h in rx) == ["answer 0", "answer 1", "answer 2"]


def test_export_points_and_originals(populated: tuple[str, str], tmp_path: Path) -> None:
    path, cid = populated
    before = json.loads(run("sessions", "export", "alpha", "--store", path, "--at", f"before:{cid}").stdout)
    assert before == _msgs(4)
    after = json.loads(run("sessions", "export", "alpha", "--store", path, "--at", f"after:{cid}").stdout)
    assert after[1]["content"].startswith("[ctxengine:lcm")
    assert json.loads(run("sessions", "export", "alpha", "--store", path, "--originals").stdout) == _msgs(4)
    out = tmp_path / "alpha.json"
    assert run("sessions", "export", "alpha", "--store", path, "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["format"] == "ctxengine.session/1"


def test_restore_to_a_point_and_import(populated: tuple[str, str], tmp_path: Path) -> None:
    path, cid = populated
    r = run("sessions", "restore", "alpha", f"before:{cid}", "--store", path)
    assert r.exit_code == 0, r.stderr
    assert "restored to" in r.stderr
    assert SqliteStore(path).history("alpha") == _msgs(4)
    doc = tmp_path / "doc.json"
    run("sessions", "export", "alpha", "--store", path, "-o", str(doc))
    other = str(tmp_path / "other.db")
    r = run("sessions", "restore", "--from", str(doc), "--store", other)
    assert r.exit_code == 0, r.stderr
    copy = SqliteStore(other)
    assert copy.history("alpha", f"before:{cid}") == _msgs(4)
    assert copy.history("alpha") == _msgs(4)
    r = run("sessions", "restore", "--from", "-", "--as", "gamma", "--store", other, input=doc.read_text())
    assert r.exit_code == 0 and "imported session gamma" in r.stderr


def test_errors_are_one_line(populated: tuple[str, str], tmp_path: Path) -> None:
    path, _ = populated
    r = run("sessions", "show", "nope", "--store", path)
    assert r.exit_code == 2 and r.stderr.strip() == "ctxengine: error: no session 'nope' in the store"
    r = run("sessions", "export", "alpha", "--store", path, "--at", "yesterday")
    assert r.exit_code == 2 and "unknown point" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in run("sessions", "restore", "--from", str(bad), "--store", path).stderr
    assert run("sessions", "restore", "alpha", "--store", path).exit_code == 2


def test_store_from_config_and_default_location(tmp_path: Path, _hermetic_home: Path) -> None:
    cfg = tmp_path / "config.yaml"
    db = tmp_path / "from-config.db"
    cfg.write_text(f"store:\n  path: {db}\n")
    SqliteStore(db).record_messages("cfg-session", _msgs(1))
    assert "cfg-session" in run("sessions", "list", "--config", str(cfg)).stdout
    r = run("sessions", "list")
    assert r.exit_code == 0 and "no sessions in the store" in r.stdout
    assert (_hermetic_home / ".local" / "share" / "ctxengine" / "sessions.db").is_file()
