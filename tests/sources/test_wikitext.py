"""WikiText through the input layer (layout wikitext): articles rebuilt from line rows, raw files and the hub's
row layout alike."""

from __future__ import annotations

import json

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.layouts import is_article_heading
from niels_gpt.sources.named import inputs

RAW_LINES = [
    " ",
    " = Alpha = ",
    " ",
    " Alpha is a letter @-@ like sign , worth 1 @,@ 000 or 2 @.@ 5 . ",
    " ",
    " = = History = = ",
    " ",
    " Old . ",
    " ",
    " = Empty = ",
    " ",
    " = Beta @-@ 2 = ",
    " ",
    " Beta text . ",
    " ",
]
ARTICLES = [
    "= Alpha =\nAlpha is a letter-like sign , worth 1,000 or 2.5 .\n= = History = =\nOld .",
    "= Beta-2 =\nBeta text .",
]
VAL_LINES = [" = Gamma = ", " ", " Gamma . ", " "]


def write_raw(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_heading_rule():
    assert is_article_heading(" = Valkyria Chronicles III = \n")
    assert is_article_heading("= M @-@ 82 ( Michigan highway ) =")
    assert not is_article_heading(" = = Gameplay = = ")
    assert not is_article_heading(" = = = Sub = = = ")
    assert not is_article_heading(" x = y = ")
    assert not is_article_heading(" ")


def wikitext(sources, **kw):
    return corpus(sources, layout="wikitext", **kw)


def test_raw_files_rebuild_articles_per_split(tmp_path):
    spec = inputs("wikitext", {"wikitext_train_file": str(write_raw(tmp_path / "wiki.train.raw", RAW_LINES)),
                               "wikitext_val_file": str(write_raw(tmp_path / "wiki.valid.raw", VAL_LINES))}, seed=42)
    assert spec["layout"] == "wikitext"
    src = wikitext(spec["sources"])
    assert list(src.iter_texts()) == ARTICLES
    assert src.skipped == {"empty_document": 1}
    assert list(wikitext(spec["val_sources"]).iter_texts()) == ["= Gamma =\nGamma ."]
    assert src.describe()["dataset_id"] is None


def test_hub_row_layout_in_parquet_gives_the_same_articles(tmp_path, write_parquet):
    # the hub's rows: "" for blank lines, other lines keep their "\n"
    rows = [{"text": "" if ln == " " else ln + "\n"} for ln in RAW_LINES]
    assert list(wikitext([write_parquet(tmp_path / "train.parquet", rows)]).iter_texts()) == ARTICLES


def test_text_before_the_first_heading_is_skipped_and_counted(tmp_path):
    src = wikitext([write_raw(tmp_path / "t.raw", [" stray line ", " ", *VAL_LINES])])
    assert list(src.iter_texts()) == ["= Gamma =\nGamma ."]
    assert src.skipped == {"before_first_heading": 1}


def test_hub_path_calls_dataset_id_config_and_hub_split_name(monkeypatch, tmp_path):
    """The hub path through `datasets`, on a local file: every call to the hub is answered with its rows."""
    import datasets

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": ln + "\n"}) + "\n" for ln in VAL_LINES))
    real, calls = datasets.load_dataset, []

    def fake(path, **kw):
        calls.append((path, kw))
        return real("json", data_files=[str(rows)], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    spec = inputs("wikitext", {}, seed=42)
    assert (spec["sources"], spec["val_sources"], spec["split"], spec["val_split"]) == (
        ["Salesforce/wikitext"], ["Salesforce/wikitext"], "train", "validation")
    val = wikitext(spec["val_sources"], hf_config=spec["hf_config"], split=spec["val_split"])
    assert list(val.iter_texts()) == ["= Gamma =\nGamma ."]
    assert calls and all(c == ("Salesforce/wikitext", {"streaming": True, "name": "wikitext-103-raw-v1",
                                                         "split": "validation"}) for c in calls)
    calls.clear()
    spec = inputs("wikitext", {"wikitext_config": "wikitext-2-raw-v1"}, seed=42)
    list(wikitext(spec["sources"], hf_config=spec["hf_config"], split=spec["split"]).iter_texts())
    assert calls and all(c == ("Salesforce/wikitext", {"streaming": True, "name": "wikitext-2-raw-v1", "split": "train"})
                         for c in calls)


def test_wikitext_rejections(tmp_path):
    with pytest.raises(ConfigError, match="--wikitext-val-file without --wikitext-train-file"):
        inputs("wikitext", {"wikitext_val_file": str(tmp_path / "v.raw")}, seed=42)
    with pytest.raises(SourceError, match=r"missing.raw: no such file or directory"):
        list(wikitext([tmp_path / "missing.raw"]).iter_texts())
    bad = tmp_path / "bad.raw"
    bad.write_bytes(b" = T = \n ok \n caf\xe9 \n")
    with pytest.raises(SourceError, match=r"bad.raw: invalid UTF-8 at byte 17, line 3"):
        list(wikitext([bad]).iter_texts())


def test_a_train_file_alone_gives_an_empty_val_split(tmp_path):
    raw = write_raw(tmp_path / "wiki.train.raw", RAW_LINES)
    spec = inputs("wikitext", {"wikitext_train_file": str(raw)}, seed=42)
    assert spec["sources"] == [str(raw)] and spec["val_sources"] == []
    assert list(wikitext(spec["sources"]).iter_texts()) == ARTICLES
