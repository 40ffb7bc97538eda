"""The bundled sample corpus: every source reads it offline, with exact counts and first records."""

from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq

from niels_gpt.sources import SAMPLE_DIR, ChatSource, TextSource, fineweb_edu, oasst1, sample_sources

FINEWEB_COLUMNS = ["text", "id", "dump", "url", "date", "file_path", "language", "language_score",
                   "token_count", "score", "int_score"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def test_sample_is_small_and_carries_its_licences():
    files = [p for p in SAMPLE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 3_000_000
    licences = (SAMPLE_DIR / "LICENSES.md").read_text(encoding="utf-8")
    for needle in ("ODC-BY", "CC BY-SA 3.0", "public domain", "Apache-2.0", "Not a real Roam export"):
        assert needle in licences


def test_sample_sources_kinds_and_describe_is_json():
    srcs = sample_sources()
    assert sorted(srcs) == ["dolly15k", "fineweb_edu", "gutenberg", "oasst1", "roam", "wikitext"]
    assert [k for k, s in srcs.items() if isinstance(s, ChatSource)] == ["dolly15k", "oasst1"]
    assert all(isinstance(srcs[k], TextSource) for k in ("fineweb_edu", "wikitext", "roam", "gutenberg"))
    for s in srcs.values():
        d = json.loads(json.dumps(s.describe()))
        assert d["name"] == s.name and d["skipped"] == {}
    # bundled files are named relative to the sample, so meta.json is the same on every clone
    assert srcs["fineweb_edu"].describe()["files"] == ["sample:fineweb_edu/web-cc-sample.parquet"]
    assert srcs["roam"].describe()["directory"] == "sample:roam"


def test_fineweb_sample_has_the_fineweb_edu_schema_and_20_pages():
    table = pq.read_table(SAMPLE_DIR / "fineweb_edu" / "web-cc-sample.parquet")
    assert table.column_names == FINEWEB_COLUMNS and table.num_rows == 20
    row = table.slice(0, 1).to_pylist()[0]
    assert (row["dump"], row["language"], row["score"], row["int_score"], row["date"]) == (
        "CC-MAIN-2020-16", "en", 3.0, 3, "2020-03-29T09:04:10Z")
    assert row["id"].startswith("<urn:uuid:") and row["file_path"].startswith("s3://commoncrawl/crawl-data/")
    plain = list(fineweb_edu(data_files=SAMPLE_DIR / "fineweb_edu" / "web-cc-sample.parquet",
                             seed=None).iter_texts())
    assert len(plain) == 20 and sum(map(len, plain)) == 155_003
    assert plain[0].startswith("We will be starting to hold weekly teleconferences") and sha(plain[0]) == "eaf42de838a5b59f"
    # the default (seeded buffer shuffle) reads the same pages in another, repeatable order
    shuffled = list(sample_sources()["fineweb_edu"].iter_texts())
    assert sorted(shuffled) == sorted(plain) and shuffled != plain


def test_wikitext_sample_articles():
    src = sample_sources()["wikitext"]
    train, val = list(src.iter_texts("train")), list(src.iter_texts("val"))
    assert (len(train), sum(map(len, train)), len(val), sum(map(len, val))) == (35, 598_143, 7, 122_372)
    assert train[0].startswith("= Homarus gammarus =\nHomarus gammarus , known as the European lobster")
    assert sha(train[0]) == "e675f2380fd8350c" and val[0].startswith("= Hu Zhengyan =\n")


def test_roam_sample_notes_and_split():
    src = sample_sources()["roam"]
    assert len(src.files()) == 31
    assert src.split_files("val") == ["The Boscombe Valley Mystery (4).md", "The Boscombe Valley Mystery (5).md",
                                      "The Red-headed League (1).md"]
    train = list(src.iter_texts("train"))
    assert (len(train), sum(map(len, train))) == (28, 169_690)
    assert train[0].startswith("- tags:: #[[Sherlock Holmes]] [[A Case of Identity]]\n- part 1 of 7")
    assert sha(train[0]) == "2c74664a936ad13f"


def test_gutenberg_sample_books_without_licence_text():
    src = sample_sources()["gutenberg"]
    assert src.split_files("val") == ["Alice-s-Adventures-in-Wonderland_11.txt"]
    (train,), (val,) = list(src.iter_texts("train")), list(src.iter_texts("val"))
    assert (len(train), sha(train)) == (421_219, "132f20b876b3452f")
    assert val.startswith("ALICE’S ADVENTURES IN WONDERLAND\n\nLewis Carroll") and val.endswith("THE END")
    assert "Gutenberg" not in train[-2000:] and "\r" not in train and "\ufeff" not in val


def test_dolly_sample_conversations():
    convs = list(sample_sources()["dolly15k"].iter_conversations())
    assert len(convs) == 34 and all([m["role"] for m in c] == ["user", "assistant"] for c in convs)
    assert convs[0][0]["content"].startswith("When did Virgin Australia start operating?\n\nContext:\nVirgin Australia, ")
    assert convs[0][1]["content"] == ("Virgin Australia commenced services on 31 August 2000 as Virgin Blue, "
                                      "with two aircraft on a single route.")


def test_oasst_sample_flat_rows_match_nested_trees():
    flat = list(sample_sources()["oasst1"].iter_conversations())
    nested = list(oasst1(trees_jsonl=SAMPLE_DIR / "oasst1" / "oasst1-trees.jsonl").iter_conversations())
    assert flat == nested and len(flat) == 25
    assert [len(c) for c in flat].count(4) == 11 and [len(c) for c in flat].count(2) == 14
    assert flat[0][0] == {"role": "user", "content": "How can I find the best 401k plan for my needs?"}
    assert flat[0][1]["content"].startswith("The first step is to research your options.")


def test_sample_has_enough_pretraining_text_for_a_16k_tokenizer():
    srcs = sample_sources()
    total = sum(len(t) for k in ("wikitext", "roam", "gutenberg") for t in srcs[k].iter_texts())
    total += 155_003  # fineweb_edu, counted in test_fineweb_sample_has_the_fineweb_edu_schema_and_20_pages
    assert total == 1_630_055
