"""Recall's candidates from the indexes: the same messages a scan finds, and texts kept in
memory only while they name the rows of the file the store has open."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from ctxengine.recall import GREP_TOOL, Recall
from ctxengine.store import SqliteStore
from ctxengine.store import sqlite as sqlite_mod

TEXTS = [
    "Grüße aus KÖLN: build FAILED at src/main/java/org/Main.java",
    "köln is lowercase here; see https://example.org/docs/Köln-Guide",
    "ERROR: JacksonException thrown by com/fasterxml/jackson/Core.java",
    "Straße STRASSE strasse",
]
QUERIES = ["KÖLN", "köln", "main.java", "MAIN.JAVA", "jacksonexception", "Straße", "STRASSE", "src/main"]


def _candidates(store: SqliteStore, query: str) -> list[tuple[str, str, list[str], str]] | None:
    Recall(store, "s").index_identifiers()
    return store.recall_candidates([query], session_id="s")


@pytest.mark.parametrize("query", QUERIES)
def test_indexed_candidates_fold_case_as_the_scan_does(tmp_path: Path, query: str) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.record_messages("s", [{"role": "tool", "content": t} for t in TEXTS])
    indexed = _candidates(store, query)
    again = store.recall_candidates([query], session_id="s")  # texts from memory this time
    scanned = store.search_texts([query], session_id="s")
    store.close()
    assert again == indexed
    assert indexed is not None or not scanned
    if indexed is not None:  # every candidate holds the query as SQLite's instr(lower(), lower()) says
        db = sqlite3.connect(":memory:")
        assert indexed and all(db.execute("SELECT instr(lower(?), lower(?)) > 0", (t, query)).fetchone()[0] for _, _, _, t in indexed)
        assert {t for _, _, _, t in indexed} <= {t for _, _, _, t in scanned}


def test_non_ascii_letters_are_not_folded_as_sqlite_lower_does_not(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.record_messages("s", [{"role": "tool", "content": "Grüße aus KÖLN: build FAILED"}, {"role": "tool", "content": "KÖLN again"}])
    found = _candidates(store, "kÖln")  # ASCII letters fold, Ö stays Ö
    missed = _candidates(store, "köln")  # ö is not Ö for SQLite's lower()
    store.close()
    assert found is not None and {t for _, _, _, t in found} == {"Grüße aus KÖLN: build FAILED", "KÖLN again"}
    assert not missed  # None (nothing found) or empty: the scan agrees


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.remove(f"{path}{suffix}")


def test_texts_kept_in_memory_are_dropped_when_the_file_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "FILE_CHECK_SECONDS", 0.0)
    path, other = tmp_path / "s.db", tmp_path / "other.db"
    store = SqliteStore(path)
    store.record_messages("s", [{"role": "tool", "content": "first file: src/app/Old.java failed"}])
    assert "src/app/Old.java" in Recall(store, "s").handle(GREP_TOOL, {"query": "src/app"})
    with SqliteStore(other) as o:  # the same keys, other texts
        o.record_messages("s", [{"role": "tool", "content": "second file: src/app/New.java failed"}])
    _remove(path)
    os.rename(other, path)
    answer = Recall(store, "s").handle(GREP_TOOL, {"query": "src/app"})
    store.close()
    assert "src/app/New.java" in answer and "Old.java" not in answer


def test_recall_keeps_per_text_results_within_a_size_bound() -> None:
    from ctxengine.recall.rank import _TextMemo

    calls: list[str] = []

    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    memo = _TextMemo(upper, 10)
    assert memo("abcd") == "ABCD" and memo("abcd") == "ABCD" and calls == ["abcd"]  # once per text
    memo("efghij")  # 10 characters kept: still within the bound
    memo("klm")  # over it: starts over
    assert memo.chars <= 10 and "abcd" not in memo.data and memo("klm") == "KLM" and calls.count("klm") == 1
