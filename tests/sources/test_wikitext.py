"""WikiText: articles rebuilt from line rows, raw files and the hub's row layout alike."""

from __future__ import annotations

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources import wikitext
from niels_gpt.sources.wikitext import is_article_heading

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


def test_raw_files_rebuild_articles_per_split(tmp_path):
    src = wikitext(data_files={"train": write_raw(tmp_path / "wiki.train.raw", RAW_LINES),
                               "validation": write_raw(tmp_path / "wiki.valid.raw", VAL_LINES)})
    assert list(src.iter_texts("train")) == ARTICLES
    assert src.skipped == {"empty_document": 1}
    assert list(src.iter_texts("val")) == ["= Gamma =\nGamma ."]
    assert list(src.iter_texts()) == ARTICLES + ["= Gamma =\nGamma ."]
    assert src.own_split and src.describe()["dataset_id"] is None


def test_hub_row_layout_in_parquet_gives_the_same_articles(tmp_path, write_parquet):
    # the hub's rows: "" for blank lines, other lines keep their "\n"
    rows = [{"text": "" if ln == " " else ln + "\n"} for ln in RAW_LINES]
    src = wikitext(data_files={"train": write_parquet(tmp_path / "train.parquet", rows)})
    assert list(src.iter_texts("train")) == ARTICLES
    assert list(src.iter_texts("val")) == []  # no validation file given: that split is empty


def test_text_before_the_first_heading_is_skipped_and_counted(tmp_path):
    src = wikitext(data_files={"train": write_raw(tmp_path / "t.raw", [" stray line ", " ", *VAL_LINES])})
    assert list(src.iter_texts("train")) == ["= Gamma =\nGamma ."]
    assert src.skipped == {"before_first_heading": 1}


def test_hub_path_calls_dataset_id_config_and_hub_split_name(monkeypatch):
    import datasets

    calls = []

    def fake(path, **kw):
        calls.append((path, kw))
        return [{"text": ln + "\n"} for ln in VAL_LINES]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert list(wikitext().iter_texts("val")) == ["= Gamma =\nGamma ."]
    assert calls == [("Salesforce/wikitext", {"streaming": True, "name": "wikitext-103-raw-v1",
                                              "split": "validation"})]
    calls.clear()
    list(wikitext(config="wikitext-2-raw-v1").iter_texts())
    assert [kw["split"] for _, kw in calls] == ["train", "validation"]
    assert calls[0][1]["name"] == "wikitext-2-raw-v1"


def test_wikitext_rejections(tmp_path):
    good = write_raw(tmp_path / "t.raw", VAL_LINES)
    with pytest.raises(ConfigError, match="data_files key 'dev' is not a split"):
        wikitext(data_files={"dev": good})
    with pytest.raises(SourceError, match=r"missing.raw: no such file or directory \(wikitext train\)"):
        wikitext(data_files={"train": tmp_path / "missing.raw"})
    bad = tmp_path / "bad.raw"
    bad.write_bytes(b" = T = \n ok \n caf\xe9 \n")
    with pytest.raises(SourceError, match=r"bad.raw: invalid UTF-8 at byte 17, line 3"):
        list(wikitext(data_files={"train": bad}).iter_texts("train"))


def test_one_path_as_data_files_is_the_train_split(tmp_path):
    raw = write_raw(tmp_path / "wiki.train.raw", RAW_LINES)
    for given in (str(raw), raw):
        src = wikitext(data_files=given)
        assert list(src.iter_texts("train")) == list(wikitext(data_files={"train": raw}).iter_texts("train"))
        assert list(src.iter_texts("val")) == []
    with pytest.raises(ConfigError, match=r"wikitext: data_files is a list; pass one path \(the train split\) or"):
        wikitext(data_files=[raw])
