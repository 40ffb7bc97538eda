"""convert: every token and document boundary survives every pair of formats; output is atomic."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.cache.formats import detect_format
from niels_gpt.cache.meta import read_meta
from niels_gpt.errors import ConfigError
from niels_gpt.formats.bos_index import load_bos_index
from niels_gpt.formats.convert import convert

EOT = 6  # the EOT id of the hand-made caches (tests/formats/conftest.py)
TARGETS = ["niels", "nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron"]


def _kw(target: str) -> dict:
    """raw uint16 output with even token counts gets a note unless it is declared not for KempnerForge."""
    return {"not_for_kempnerforge": True} if target == "raw" else {}
SOURCES = [(t, False) for t in TARGETS] + [("nanogpt", True), ("nanogpt-legacy", True)]


def _documents(tokens: list[int], eot: int) -> list[list[int]]:
    docs, cur = [], []
    for t in tokens:
        if t == eot:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs + ([cur] if cur else [])


@pytest.mark.parametrize("src_fmt, bos", SOURCES)
def test_every_format_pair_round_trips_real_text(real_cache, tokenizer, tmp_path, src_fmt, bos, read_tokens):
    """real text -> our cache -> SRC format -> every target -> back to our cache: identical tokens."""
    original = read_tokens(real_cache)
    assert original["val"][-1] == tokenizer.eot_id  # the builder closes the document its budget cut
    mid = tmp_path / "mid"
    convert(real_cache, mid, to=src_fmt, bos_index=bos, max_tokens_per_file=5000, **_kw(src_fmt))
    for target in TARGETS:
        out, back = tmp_path / f"to-{target}", tmp_path / f"back-{target}"
        convert(mid, out, to=target, **_kw(target))
        convert(out, back, to="niels")
        assert read_tokens(back) == original, (src_fmt, bos, target)
    text = tokenizer.decode([t for t in _documents(read_tokens(back)["train"], tokenizer.eot_id)[0]])
    assert text and text == tokenizer.decode(_documents(original["train"], tokenizer.eot_id)[0])


def test_bos_prefixed_nanogpt_moves_each_eot_to_the_front(small_cache, tmp_path, read_tokens):
    convert(small_cache, tmp_path / "n", to="nanogpt", bos_index=True)
    assert read_tokens(tmp_path / "n") == {"train": [EOT, 10, 11, 12, EOT, 13, 14, EOT, EOT, 15],
                                         "val": [EOT, 16, 17]}
    side = tmp_path / "n" / "train" / "train_000000.bos.idx"
    assert np.fromfile(side, "<i4").tolist() == [0, 4, 7, 8]
    convert(tmp_path / "n", tmp_path / "back", to="niels")
    assert read_tokens(tmp_path / "back") == read_tokens(small_cache)


def test_explicit_bos_id_prefixes_documents_with_it(small_cache, tmp_path, read_tokens):
    convert(small_cache, tmp_path / "n", to="nanogpt", bos_index=True, bos_id=1)
    assert read_tokens(tmp_path / "n")["val"] == [1, 16, 17]
    convert(tmp_path / "n", tmp_path / "k", to="kempner-npy")
    assert read_tokens(tmp_path / "k")["val"] == [16, 17, EOT]


def test_megatron_has_one_sequence_per_document(small_cache, tmp_path):
    convert(small_cache, tmp_path / "m", to="megatron")
    info = detect_format(tmp_path / "m").splits["train"]
    assert info.megatron[0].lengths.tolist() == [4, 3, 1, 2]
    assert info.megatron[0].document_bounds().tolist() == [0, 4, 7, 8, 10]
    assert info.documents == 4


def test_converted_cache_meta_records_what_is_known(small_cache, tmp_path):
    convert(small_cache, tmp_path / "raw", to="raw", not_for_kempnerforge=True)
    convert(tmp_path / "raw", tmp_path / "ours", to="niels")
    meta = read_meta(str(tmp_path / "ours"))
    assert meta["totals"] == {"train_tokens": 10, "val_tokens": 3, "train_documents": 4, "val_documents": 1}
    assert meta["special_token_ids"] == {"sys": None, "usr": None, "asst": None, "eot": EOT}
    assert meta["tokenizer_sha256"] == "0" * 64 and meta["vocab_size"] == 2004
    assert meta["source"]["converted_from"]["format"] == "raw"
    assert sorted(meta["files"]) == ["train/shard_00000.bin", "val/shard_00000.bin"]


def test_foreign_stream_without_ids_needs_eot_for_our_cache(tmp_path, read_tokens):
    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "a.npy", np.array([1, 2, 9, 3], dtype="<u2"))
    with pytest.raises(ConfigError, match="no EOT id is known for this source; pass --eot-id N"):
        convert(tmp_path / "src", tmp_path / "out", to="niels")
    assert not (tmp_path / "out").exists()
    convert(tmp_path / "src", tmp_path / "out", to="niels", eot_id=9)
    meta = read_meta(str(tmp_path / "out"))
    assert meta["tokenizer_sha256"] is None and meta["totals"]["train_documents"] == 1
    assert read_tokens(tmp_path / "out") == {"train": [1, 2, 9, 3], "val": []}


def test_failed_conversion_leaves_nothing(small_cache, tmp_path, cache_maker):
    big = cache_maker(tmp_path / "big", {"train": [[70000, EOT]]}, dtype="uint32-le", vocab_size=70001)
    with pytest.raises(ConfigError, match="holds only uint16 tokens"):
        convert(big, tmp_path / "out", to="nanogpt-legacy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "cache"]
    with pytest.raises(ConfigError, match="is the input .* itself"):
        convert(small_cache, small_cache, to="raw")
    with pytest.raises(ConfigError, match=r"holds a token cache \(.*\), not a converted corpus .* not replaced by another kind"):
        convert(small_cache, big, to="raw")
    with pytest.raises(ConfigError, match="unknown target format 'parquet'"):
        convert(small_cache, tmp_path / "o", to="parquet")
    with pytest.raises(ConfigError, match="--bos-index applies to --to nanogpt"):
        convert(small_cache, tmp_path / "o", to="raw", bos_index=True)


def test_narrowing_dtype_checks_every_id(tmp_path, cache_maker):
    big = cache_maker(tmp_path / "big", {"train": [[70000, EOT]]}, dtype="uint32-le", vocab_size=70001)
    from niels_gpt.errors import FormatError

    with pytest.raises(ConfigError, match=r"--dtype uint16: the source's vocabulary has 70,001 ids"):
        convert(big, tmp_path / "out", to="raw", dtype="uint16")  # refused before a token is read
    raw = tmp_path / "raw.bin"  # a headerless file records no vocabulary: every id is checked as it is written
    np.array([5, 70000, EOT], dtype="<u4").tofile(raw)
    with pytest.raises(FormatError, match="token id 70000 does not fit uint16"):
        convert(raw, tmp_path / "out", to="raw", dtype="uint16", src_dtype="uint32", eot_id=EOT)
    assert not (tmp_path / "out").exists()


def test_foreign_byte_offset_sidecar_is_detected(small_cache, tmp_path):
    convert(small_cache, tmp_path / "n", to="nanogpt", bos_index=True)
    shard = tmp_path / "n" / "train" / "train_000000.bin"
    side = shard.with_name("train_000000.bos.idx")
    tokens = detect_format(shard).token_files[0].open()
    (1024 + np.array([0, 4, 7, 8]) * 2).astype("<i4").tofile(side)  # the public writer's bug
    with pytest.warns(UserWarning, match="header-inclusive byte offsets, not token indices"):
        pos, bos = load_bos_index(shard, tokens, EOT)
    assert pos.tolist() == [0, 4, 7, 8] and bos == EOT
    np.array([1, 2], dtype="<i4").tofile(side)
    with pytest.warns(UserWarning, match="do not land on BOS token 6; ignoring the sidecar and scanning"):
        pos, _ = load_bos_index(shard, tokens, EOT)
    assert pos.tolist() == [0, 4, 7, 8]
    side.unlink()
    assert load_bos_index(shard, tokens, EOT) is None


def test_megatron_core_reads_our_pair(small_cache, tmp_path):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    convert(small_cache, tmp_path / "m", to="megatron")
    ds = IndexedDataset(str(tmp_path / "m" / "train" / "train"))
    assert [ds[i].tolist() for i in range(len(ds))] == [[10, 11, 12, EOT], [13, 14, EOT], [EOT], [15, EOT]]
    assert ds.document_indices.tolist() == [0, 1, 2, 3, 4]


def test_cli_convert_and_prepare_data(small_cache, tmp_path, capsys):
    assert main(["convert", str(small_cache), str(tmp_path / "k"), "--to", "kempner-npy"]) == 0
    assert "train: 10 tokens, 4 documents, 1 file(s), uint16, eot=6" in capsys.readouterr().out
    assert main(["prepare-data", str(tmp_path / "k"), "--seq-len", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["format"] == "kempner-npy" and rep["vocab_size"] == 2004
    assert rep["splits"]["train"].pop("calls") and rep["splits"]["train"].pop("kempnerforge")
    assert rep["splits"]["train"] == {"files": 1, "tokens": 10, "eot_id": EOT, "bos_id": None, "samples": 2,
                                      "max_id": 15, "eot_count": 4, "bos_count": 0, "first_token": 10,
                                      "last_token": EOT, "top_ids_share": None}  # too few tokens to judge
    assert main(["prepare-data", str(small_cache), "--seq-len", "3"]) == 0
    captured = capsys.readouterr()
    assert "MemoryMappedDataset(" in captured.out and "eos_token_id=6)" in captured.out
    assert "KempnerForge infers uint32" in captured.err
    assert main(["convert", str(small_cache), str(tmp_path / "x"), "--to", "nanogpt-legacy",
                 "--dtype", "uint32"]) == 1
    assert "error: the legacy nanoGPT format" in capsys.readouterr().err


def test_empty_split_survives_every_format(tmp_path, cache_maker, read_tokens):
    src = cache_maker(tmp_path / "src", {"train": [[10, EOT, 11, EOT]]})
    for target in TARGETS:
        convert(src, tmp_path / target, to=target, **_kw(target))
        convert(tmp_path / target, tmp_path / f"{target}-back", to="niels")
        assert read_tokens(tmp_path / f"{target}-back") == {"train": [10, EOT, 11, EOT], "val": []}, target


@pytest.mark.parametrize("src_fmt, bos", SOURCES)
def test_an_unterminated_last_document_round_trips(cache_maker, tmp_path, src_fmt, bos, read_tokens):
    """A stream whose last document has no EOT (as foreign corpora often end) keeps its open tail."""
    cache = cache_maker(tmp_path / "c", {"train": [[10, 11, 6, 12, 13, 14, 6, 15, 16]], "val": [[20, 6, 21]]})
    original = read_tokens(cache)
    mid = tmp_path / "mid"
    convert(cache, mid, to=src_fmt, bos_index=bos, **_kw(src_fmt))
    for target in TARGETS:
        out, back = tmp_path / f"to-{target}", tmp_path / f"back-{target}"
        convert(mid, out, to=target, **_kw(target))
        convert(out, back, to="niels")
        assert read_tokens(back) == original, (src_fmt, bos, target)


def test_prepare_data_does_not_warn_about_eot_on_a_bos_framed_stream(small_cache, tmp_path, capsys):
    # --bos-index frames documents as BOS d1 BOS d2: the stream ends inside its last document by design.
    assert main(["convert", str(small_cache), str(tmp_path / "n"), "--to", "nanogpt", "--bos-index"]) == 0
    capsys.readouterr()
    assert main(["prepare-data", str(tmp_path / "n"), "--seq-len", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["splits"]["train"]["first_token"] == rep["splits"]["train"]["bos_id"]
    assert not [w for w in rep["warnings"] if "does not end with EOT" in w]

