"""fineweb_edu (the hub call, local jsonl/parquet) and plain text, through the input layer."""

from __future__ import annotations

import json

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources.corpus import corpus
from niels_gpt.sources.named import inputs

DOCS = [f"document number {i}: " + "word " * i for i in range(12)]


def rows():
    return [{"text": t, "id": f"<urn:{i}>", "url": f"http://x/{i}"} for i, t in enumerate(DOCS)]


def hub(monkeypatch, tmp_path, rows):
    """Every `datasets.load_dataset` call answered with `rows` (a local JSON Lines file read by `datasets`, as the
    hub's stream is); returns the calls made."""
    import datasets

    f = tmp_path / "hub-rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    real, calls = datasets.load_dataset, []

    def fake(path, **kw):
        calls.append((path, kw))
        return real("json", data_files=[str(f)], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    return calls


def test_fineweb_hub_path_is_the_contracts_call(monkeypatch, tmp_path):
    calls = hub(monkeypatch, tmp_path, [{"text": "a"}, {"text": "  "}, {"text": None}, {"text": "b"}])
    spec = inputs("fineweb_edu", {}, seed=42)
    assert (spec["sources"], spec["hf_config"], spec["split"], spec["shuffle_buffer"], spec["layout"]) == (
        ["HuggingFaceFW/fineweb-edu"], "CC-MAIN-2024-10", "train", 10_000, "text")
    src = corpus(spec["sources"], hf_config=spec["hf_config"], split=spec["split"])
    assert list(src.iter_texts()) == ["a", "b"]  # in order: build() adds the seeded shuffle (tests/sources/test_hub_shuffle.py)
    assert calls and all(c == ("HuggingFaceFW/fineweb-edu", {"streaming": True, "name": "CC-MAIN-2024-10",
                                                              "split": "train"}) for c in calls)
    assert src.skipped == {"empty_document": 1, "null_text": 1}
    d = src.describe()
    assert (d["dataset_id"], d["dataset_config"], d["streaming"]) == ("HuggingFaceFW/fineweb-edu", "CC-MAIN-2024-10", True)


def test_fineweb_hub_failure_is_a_source_error(monkeypatch):
    import datasets

    def offline(path, **kw):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SourceError, match=r"cannot open 'HuggingFaceFW/fineweb-edu' .*ConnectionError: hub "
                                          r"unreachable; check the dataset id/config and network"):
        list(corpus(["HuggingFaceFW/fineweb-edu"], hf_config="CC-MAIN-2024-10").iter_texts())


def test_fineweb_local_jsonl_in_file_order(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", rows()[:7] + [{"text": "", "id": "e"}])
    g = write_jsonl(tmp_path / "b.jsonl", rows()[7:])
    spec = inputs("fineweb_edu", {"fineweb_data_files": [str(f), str(g)]}, seed=42)
    assert (spec["sources"], spec["hf_config"], spec["shuffle_buffer"]) == ([str(f), str(g)], None, 10_000)
    src = corpus(spec["sources"])
    assert list(src.iter_texts()) == DOCS
    assert src.skipped == {"empty_document": 1}
    assert src.describe()["files"] == [str(f), str(g)]
    assert src.describe()["dataset_id"] is None


def test_fineweb_text_field_override_and_missing_field(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", [{"body": "x"}, {"body": "y"}])
    assert list(corpus([f], text_field="body").iter_texts()) == ["x", "y"]
    with pytest.raises(SourceError, match=r"a.jsonl, line 1: no 'text' field \(fields: \['body'\]\)"):
        list(corpus([f]).iter_texts())


def test_fineweb_rejects_bad_arguments(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", rows())
    with pytest.raises(ConfigError, match="--fineweb-buffer-size 0: must be >= 1"):
        inputs("fineweb_edu", {"fineweb_buffer_size": 0}, seed=42)
    with pytest.raises(ConfigError, match="a corpus has no train/val split of its own"):
        list(corpus([f]).iter_texts("train"))


def test_plain_text_reads_through_the_one_input_layer(tmp_path, write_jsonl, write_parquet):
    """What a build reads, in Python (sources/corpus.py): a text file is one document (BOM and CRLF normalised),
    JSON Lines and Parquet give their text field, in the order given; blank and null texts are counted apart."""
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfsecond\r\nfile\r\n")
    (tmp_path / "a.txt").write_text("first file\n")
    (tmp_path / "c.txt").write_text("  \n")
    src = corpus([tmp_path])
    assert list(src.iter_texts()) == ["first file\n", "second\nfile\n"] and src.skipped == {"empty_document": 1}
    j = write_jsonl(tmp_path / "x.jsonl", [{"text": "j0"}, {"text": "j1"}, {"text": None}])
    p = write_parquet(tmp_path / "y.parquet", [{"text": "p0", "n": 1}, {"text": "p1", "n": 2}])
    src = corpus([p, tmp_path / "a.txt", j])
    assert list(src.iter_texts()) == ["p0", "p1", "first file\n", "j0", "j1"] and src.skipped == {"null_text": 1}


def test_a_csv_field_of_any_length_is_read_as_json_lines_reads_it(tmp_path, write_jsonl):
    # a web page of 200,000 characters: Python's csv module refuses fields over 131,072 characters by default
    import csv

    long = "word " * 40_000 + "end"
    with open(tmp_path / "pages.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["id", "text"], ["1", long], ["2", "short"]])
    j = write_jsonl(tmp_path / "pages.jsonl", [{"text": long}, {"text": "short"}])
    assert list(corpus([tmp_path / "pages.csv"]).iter_texts()) == list(corpus([j]).iter_texts()) == [long, "short"]


@pytest.mark.parametrize("content, message", [
    (b'{"text": "a"}\n{oops\n', r"mal.jsonl, line 2: not valid JSON"),
    (b'{"text": "a"}\n["text"]\n', r"mal.jsonl, line 2: a JSON list, not an object"),
    (b'{"text": "a"}\n{"text": "x\\ud800y"}\n', r"mal.jsonl, line 2: a lone surrogate escape"),
    (b'{"text": "a"}\n{"text": "caf\xe9"}\n', r"mal.jsonl, line 2: not UTF-8 .*byte 27 of the file.*0xe9 is 'é' in both cp1252 and latin-1"),
    (b'{"text": "a"}\n{"body": "b"}\n', r"mal.jsonl, line 2: no 'text' field \(fields: \['body'\]\)"),
    (b'{"text": "a"}\n{"text": 5}\n', r"mal.jsonl, line 2: field 'text' is int, not text"),
])
def test_bad_json_lines_are_named_by_line(tmp_path, content, message):
    f = tmp_path / "mal.jsonl"
    f.write_bytes(content)
    with pytest.raises(SourceError, match=message):
        list(corpus([f]).iter_texts())


def test_invalid_utf8_hint_names_the_bytes_and_the_likely_encoding(tmp_path):
    f = tmp_path / "smart.txt"
    f.write_bytes(b"He said \x93hi\x94.")
    with pytest.raises(SourceError, match=r"byte 8, line 1.*the bytes are 0x93 0x68 0x69 0x94; 0x93 is '\u201c' in "
                                          r"cp1252.*most likely cp1252: `iconv -f cp1252 -t utf-8`"):
        list(corpus([f]).iter_texts())
