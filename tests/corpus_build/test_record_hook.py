"""A per-record hook (--map module:function) and --min-chars: run by every executor, byte-identical, recorded."""

from __future__ import annotations

import json

import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta

from .conftest import docs

pytest.importorskip("tokenizers")

HOOK = '''
def shout(doc):
    if isinstance(doc, str):
        return None if "Holmes" in doc else doc.upper()
    return doc
'''


@pytest.fixture
def hooked(tmp_path, monkeypatch):
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "my_hooks.py").write_text(HOOK)
    monkeypatch.syspath_prepend(str(tmp_path / "hooks"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "hooks"))
    d = tmp_path / "d"
    d.mkdir()
    texts = docs(12) + ["tiny", "Holmes was here, and a long sentence follows it to pass the filter."]
    for k in range(3):  # three inputs: several tasks for the processes executor
        (d / f"{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k::3]))
    return d, texts


def test_the_hook_and_min_chars_give_one_cache_on_every_executor(tmp_path, hooked, bpe_json):
    d, texts = hooked
    trees = []
    for ex in ("inline", "processes"):
        out = tmp_path / ex
        assert main(["build", str(d), "--out", str(out), "--tokenizer", str(bpe_json), "--map", "my_hooks:shout",
                     "--min-chars", "10", "--executor", ex, "--workers", "2", "--task-bytes", "1", "--name", "same",
                     "--no-progress"]) == 0
        trees.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert trees[0] == trees[1]
    meta = read_meta(str(tmp_path / "inline"))
    assert meta["source"]["map"] == "my_hooks:shout" and meta["source"]["min_chars"] == 10
    assert meta["skipped"]["dropped_by_map"] == sum("Holmes" in t for t in texts) >= 1
    assert meta["skipped"]["below_min_chars"] == 1
    kept = [t for t in texts if "Holmes" not in t and len(t) >= 10]
    assert meta["totals"]["train_documents"] == len(kept)


def test_a_hook_that_cannot_be_imported_is_refused_before_any_work(tmp_path, bpe_json, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("text")
    assert main(["build", str(d), "--out", str(tmp_path / "c"), "--tokenizer", str(bpe_json), "--map",
                 "nowhere_at_all:f", "--no-progress"]) == 1
    assert "error: --map nowhere_at_all:f: cannot import 'nowhere_at_all'" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
