"""Every named source, through the input layer, on the real corpora in ../shared/data (skipped where that directory is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.named import inputs

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
pytestmark = [pytest.mark.real_data,
              pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent")]


def test_gutenberg_ten_books_lose_their_licence_text():
    spec = inputs("gutenberg", {"gutenberg_dir": str(DATA / "gutenberg")}, seed=42)
    books = [b for k in ("sources", "val_sources") for b in corpus(spec[k], layout="gutenberg").iter_texts()]
    assert len(books) == 10 and [Path(p).name for p in spec["val_sources"]] == ["Alice-s-Adventures-in-Wonderland_11.txt"]
    assert sum(map(len, books)) == 9_449_252
    for b in books:
        assert "*** START OF" not in b and "*** END OF" not in b and "\r" not in b
        assert "End of the Project Gutenberg" not in b and "End of Project Gutenberg" not in b


def test_wikitext2_validation_rebuilds_60_articles():
    src = corpus([DATA / "wikitext" / "wikitext-2-raw.wiki.valid.raw"], layout="wikitext")
    arts = list(src.iter_texts())
    assert len(arts) == 60 and src.skipped == {}
    assert arts[0].startswith("= Homarus gammarus =\n") and arts[-1].startswith("= Rakie Ayola =\n")
    assert sum(" @-@ " in a for a in arts) == 0 and "-" in arts[0]


def test_oasst_100_trees_give_100_conversations():
    src = corpus([DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"], layout="oasst", chat=True)
    convs = list(src.iter_conversations())
    assert len(convs) == 100 and sum(map(len, convs)) == 284
    # every one of the 1,167 messages is in a conversation or counted by why it is not
    assert sum(src.skipped.values()) + 284 == 1167 and set(src.skipped) == {"unselected_message", "trailing_user_turn"}
    assert all(c[-1]["role"] == "assistant" for c in convs)


def test_dolly_web_and_plain_text():
    assert len(list(corpus([DATA / "dolly-15k" / "databricks-dolly-15k.first34.jsonl"], layout="dolly", chat=True)
                    .iter_conversations())) == 34
    web = sorted((DATA / "web-cc-sample").glob("*.jsonl"))
    docs = list(corpus(web).iter_texts())
    assert len(docs) == 20 and len(docs[0]) == 435
    (shakespeare,) = list(corpus([DATA / "tinyshakespeare" / "input.txt"]).iter_texts())
    assert len(shakespeare) == 1_115_394 and shakespeare.startswith("First Citizen:\n")
