"""Every record a source or a builder skips is counted by reason in meta.json and printed in the summary
(the source is described after its stream was read, not before)."""

import json

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.cache.cli import main
from niels_gpt.cache.meta import read_meta
from niels_gpt.sources.corpus import corpus


def test_source_skips_reach_meta_json(tmp_path, tokenizer):
    f = tmp_path / "docs.jsonl"
    f.write_text('{"text": "kept one"}\n{"text": null}\n{"text": "   "}\n{"text": "kept two"}\n')
    src = corpus([f])
    build_pretrain_cache(src.iter_texts(), str(tmp_path / "c"), tokenizer=tokenizer, max_train_tokens=10**6,
                         max_val_tokens=0, shard_bytes=1 << 20, seed=0, shuffle_buffer=None, source=src.describe)
    meta = read_meta(str(tmp_path / "c"))
    assert meta["skipped"] == {"empty_document": 1, "null_text": 1}
    assert meta["source"]["skipped"] == {"empty_document": 1, "null_text": 1}
    assert meta["totals"]["train_documents"] == 2


def test_build_all_counts_and_prints_what_it_skipped(tmp_path, tokenizer, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(6):
        (notes / f"n{i}.md").write_text(f"- note {i}\n" if i % 3 else "  \n\n")
    dolly = tmp_path / "dolly.jsonl"
    rows = [{"instruction": f"q{i}", "context": "", "response": f"a{i}" if i % 4 else "", "category": "qa"}
            for i in range(8)]
    dolly.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["build-all", "--cache-dir", str(tmp_path / "c"), "--tokenizer", tokenizer.model_path,
                 "--only", "roam", "dolly15k", "--roam-dir", str(notes), "--roam-val-frac", "0",
                 "--dolly-data-files", str(dolly)]) == 0
    roam_meta = read_meta(str(tmp_path / "c" / "pretrain" / "roam"))
    dolly_meta = read_meta(str(tmp_path / "c" / "sft" / "dolly15k"))
    assert roam_meta["skipped"]["empty_document"] == 2
    assert sum(dolly_meta["skipped"].values()) == 2 and dolly_meta["totals"]["train_examples"] + \
        dolly_meta["totals"]["val_examples"] == 6
    out = capsys.readouterr().out
    assert "skipped records (by reason; also in each meta.json):" in out
    assert "  roam: 2 empty_document" in out
