"""The bundled sample corpus: every named source reads it offline through the input layer, with exact counts and
first records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from niels_gpt.sources import SAMPLE_DIR
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.named import NAMED, inputs

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


def read(name: str, split: str = "train") -> list:
    """A named source's documents (or conversations) of one split, on the bundled sample, through the input layer:
    the sources, layout and split of build-all's table (sources/named.py), read lazily by `corpus`."""
    spec = inputs(name, {}, seed=42, sample=True)
    sources = spec["sources"] if split == "train" else spec["val_sources"]
    src = corpus(sources, layout=spec["layout"], chat=spec.get("chat", False))
    out = list(src.iter_conversations() if spec.get("chat") else src.iter_texts())
    skipped = {"unselected_message": 189, "trailing_user_turn": 11} if name == "oasst1" else {}
    assert src.skipped == skipped  # oasst1: 72 messages in conversations + 200 left out = the 272 rows
    return out


def test_named_sources_of_the_sample_and_describe_is_json():
    specs = {name: inputs(name, {}, seed=42, sample=True) for name in NAMED}
    assert sorted(specs) == ["dolly15k", "fineweb_edu", "gutenberg", "oasst1", "roam", "wikitext"]
    assert [k for k, s in specs.items() if s.get("chat")] == ["dolly15k", "oasst1"]
    assert {k: s["layout"] for k, s in specs.items()} == {
        "fineweb_edu": "text", "roam": "text", "wikitext": "wikitext", "gutenberg": "gutenberg", "dolly15k": "dolly",
        "oasst1": "oasst"}
    d = json.loads(json.dumps(corpus(specs["fineweb_edu"]["sources"]).describe()))
    # bundled files are named relative to the sample, so meta.json is the same on every clone
    assert d["files"] == ["sample:fineweb_edu/web-cc-sample.parquet"] and d["skipped"] == {}
    assert specs["roam"]["extra"]["split_rule"].endswith("directory sample:roam)")


def test_fineweb_sample_has_the_fineweb_edu_schema_and_20_pages():
    table = pq.read_table(SAMPLE_DIR / "fineweb_edu" / "web-cc-sample.parquet")
    assert table.column_names == FINEWEB_COLUMNS and table.num_rows == 20
    row = table.slice(0, 1).to_pylist()[0]
    assert (row["dump"], row["language"], row["score"], row["int_score"], row["date"]) == (
        "CC-MAIN-2020-16", "en", 3.0, 3, "2020-03-29T09:04:10Z")
    assert row["id"].startswith("<urn:uuid:") and row["file_path"].startswith("s3://commoncrawl/crawl-data/")
    plain = read("fineweb_edu")
    assert len(plain) == 20 and sum(map(len, plain)) == 155_003
    assert plain[0].startswith("We will be starting to hold weekly teleconferences") and sha(plain[0]) == "eaf42de838a5b59f"


def test_wikitext_sample_articles():
    train, val = read("wikitext"), read("wikitext", "val")
    assert (len(train), sum(map(len, train)), len(val), sum(map(len, val))) == (35, 598_143, 7, 122_372)
    assert train[0].startswith("= Homarus gammarus =\nHomarus gammarus , known as the European lobster")
    assert sha(train[0]) == "e675f2380fd8350c" and val[0].startswith("= Hu Zhengyan =\n")


def test_roam_sample_notes_and_split():
    spec = inputs("roam", {}, seed=42, sample=True)
    assert len(spec["sources"] + spec["val_sources"]) == 31
    assert [Path(p).name for p in spec["val_sources"]] == ["The Boscombe Valley Mystery (4).md", "The Boscombe Valley Mystery (5).md",
                                      "The Red-headed League (1).md"]
    train = read("roam")
    assert (len(train), sum(map(len, train))) == (28, 169_690)
    assert train[0].startswith("- tags:: #[[Sherlock Holmes]] [[A Case of Identity]]\n- part 1 of 7")
    assert sha(train[0]) == "2c74664a936ad13f"


def test_gutenberg_sample_books_without_licence_text():
    spec = inputs("gutenberg", {}, seed=42, sample=True)
    assert [Path(p).name for p in spec["val_sources"]] == ["Alice-s-Adventures-in-Wonderland_11.txt"]
    (train,), (val,) = read("gutenberg"), read("gutenberg", "val")
    assert (len(train), sha(train)) == (421_219, "132f20b876b3452f")
    assert val.startswith("ALICE’S ADVENTURES IN WONDERLAND\n\nLewis Carroll") and val.endswith("THE END")
    assert "Gutenberg" not in train[-2000:] and "\r" not in train and "\ufeff" not in val


def test_dolly_sample_conversations():
    convs = read("dolly15k")
    assert len(convs) == 34 and all([m["role"] for m in c] == ["user", "assistant"] for c in convs)
    assert convs[0][0]["content"].startswith("When did Virgin Australia start operating?\n\nContext:\nVirgin Australia, ")
    assert convs[0][1]["content"] == ("Virgin Australia commenced services on 31 August 2000 as Virgin Blue, "
                                      "with two aircraft on a single route.")


def test_oasst_sample_flat_rows_match_nested_trees():
    flat = read("oasst1")
    nested = list(corpus([SAMPLE_DIR / "oasst1" / "oasst1-trees.jsonl"], layout="oasst", chat=True).iter_conversations())
    assert flat == nested and len(flat) == 25
    assert [len(c) for c in flat].count(4) == 11 and [len(c) for c in flat].count(2) == 14
    assert flat[0][0] == {"role": "user", "content": "How can I find the best 401k plan for my needs?"}
    assert flat[0][1]["content"].startswith("The first step is to research your options.")


def test_sample_has_enough_pretraining_text_for_a_16k_tokenizer():
    total = sum(len(t) for k in ("wikitext", "roam", "gutenberg") for split in ("train", "val") for t in read(k, split))
    total += 155_003  # fineweb_edu, counted in test_fineweb_sample_has_the_fineweb_edu_schema_and_20_pages
    assert total == 1_630_055
