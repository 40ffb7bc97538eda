"""fineweb_edu (hub call shape, local jsonl/parquet through the same code) and plain text through the input layer."""

from __future__ import annotations

import pytest

from niels_gpt.errors import ConfigError, SourceError
from niels_gpt.sources import fineweb_edu
from niels_gpt.sources.corpus import corpus

DOCS = [f"document number {i}: " + "word " * i for i in range(12)]


def rows():
    return [{"text": t, "id": f"<urn:{i}>", "url": f"http://x/{i}"} for i, t in enumerate(DOCS)]


class FakeStream:
    """Stands in for the hub's IterableDataset and records the calls made on it."""

    calls: list = []

    def __init__(self, rows):
        self.rows = rows

    def shuffle(self, **kw):
        FakeStream.calls.append(("shuffle", kw))
        return FakeStream(list(reversed(self.rows)))

    def __iter__(self):
        return iter(self.rows)


def test_fineweb_hub_path_is_the_contracts_call(monkeypatch):
    import datasets

    def fake_load_dataset(path, **kw):
        FakeStream.calls.append(("load_dataset", path, kw))
        return FakeStream([{"text": "a"}, {"text": "  "}, {"text": None}, {"text": "b"}])

    FakeStream.calls = []
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    src = fineweb_edu()
    assert list(src.iter_texts()) == ["b", "a"]
    assert FakeStream.calls == [
        ("load_dataset", "HuggingFaceFW/fineweb-edu", {"streaming": True, "name": "CC-MAIN-2024-10",
                                                       "split": "train"}),
        ("shuffle", {"seed": 42, "buffer_size": 10_000}),
    ]
    assert src.skipped == {"empty_document": 2}
    d = src.describe()
    assert (d["dataset_id"], d["dataset_config"], d["streaming"], d["seed"]) == (
        "HuggingFaceFW/fineweb-edu", "CC-MAIN-2024-10", True, 42)


def test_fineweb_hub_failure_is_a_source_error(monkeypatch):
    import datasets

    def offline(path, **kw):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SourceError, match=r"cannot open 'HuggingFaceFW/fineweb-edu' .*ConnectionError: hub "
                                          r"unreachable; .*pass local data_files"):
        list(fineweb_edu().iter_texts())


def test_fineweb_local_jsonl_in_file_order_without_shuffle(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", rows()[:7] + [{"text": "", "id": "e"}])
    g = write_jsonl(tmp_path / "b.jsonl", rows()[7:])
    src = fineweb_edu(data_files=[f, g], seed=None)
    assert list(src.iter_texts()) == DOCS
    assert src.skipped == {"empty_document": 1}
    assert src.describe()["files"] == [str(f), str(g)]
    assert src.describe()["dataset_id"] is None


def test_fineweb_local_shuffle_is_seeded_and_complete(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", rows())
    a = list(fineweb_edu(data_files=f).iter_texts())
    assert a == list(fineweb_edu(data_files=f, seed=42).iter_texts())
    assert sorted(a) == sorted(DOCS) and a != DOCS
    assert list(fineweb_edu(data_files=f, seed=7).iter_texts()) != a


def test_fineweb_text_field_override_and_missing_field(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", [{"body": "x"}, {"body": "y"}])
    assert list(fineweb_edu(data_files=f, seed=None, text_field="body").iter_texts()) == ["x", "y"]
    with pytest.raises(SourceError, match=r"a.jsonl'\], record 0: no 'text' field \(fields: \['body'\]\)"):
        list(fineweb_edu(data_files=f, seed=None).iter_texts())


def test_fineweb_rejects_bad_arguments(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "a.jsonl", rows())
    (tmp_path / "b.csv").write_text("text\nx\n")
    with pytest.raises(SourceError, match=r"missing.parquet: no such file or directory \(fineweb_edu data_files\)"):
        fineweb_edu(data_files=tmp_path / "missing.parquet")
    with pytest.raises(ConfigError, match=r"b.csv: unsupported file type '.csv' for fineweb_edu"):
        fineweb_edu(data_files=tmp_path / "b.csv")
    (tmp_path / "c.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"data_files mix file types \(\['json', 'parquet'\]\)"):
        fineweb_edu(data_files=[f, tmp_path / "c.parquet"])
    with pytest.raises(ConfigError, match="buffer_size=0 must be >= 1"):
        fineweb_edu(data_files=f, buffer_size=0)
    with pytest.raises(ConfigError, match="fineweb_edu has no train/val split of its own"):
        list(fineweb_edu(data_files=f).iter_texts("train"))
    with pytest.raises(ConfigError, match="unknown split 'test'"):
        list(fineweb_edu(data_files=f).iter_texts("test"))


def test_fineweb_invalid_utf8_names_file_and_byte(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(SourceError, match=r"bad.jsonl: invalid UTF-8 at byte 30, line 2"):
        list(fineweb_edu(data_files=f, seed=None).iter_texts())


def test_fineweb_malformed_json_names_the_files(tmp_path):
    f = tmp_path / "mal.jsonl"
    f.write_text('{"text": "a"}\n{oops\n')
    # datasets reports the block (record 0); the file is re-read to name the line that is bad
    with pytest.raises(SourceError, match=r"mal.jsonl, line 2: not valid JSON"):
        list(fineweb_edu(data_files=f, seed=None).iter_texts())


def test_fineweb_lone_surrogate_names_file_and_line(tmp_path):
    f = tmp_path / "sur.jsonl"
    f.write_text('{"text": "fine doc"}\n{"text": "bad \\ud800 here"}\n')
    with pytest.raises(SourceError, match=r"sur.jsonl, line 2: a lone surrogate escape \('\\ud800'\)"):
        list(fineweb_edu(data_files=f, seed=None).iter_texts())


def test_an_empty_local_jsonl_is_named_as_empty_not_blamed_on_the_network(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(SourceError, match=r"empty.jsonl: the file is empty \(fineweb_edu") as info:
        list(fineweb_edu(data_files=f, seed=None).iter_texts())
    assert "network" not in str(info.value)


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
