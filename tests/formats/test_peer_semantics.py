"""Regression tests for the peers' exact semantics (issue 9, items 1, 4, 5, 6, 7)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.errors import ConfigError
from niels_gpt.formats.convert import convert
from niels_gpt.formats.nanogpt_dataset import NanogptDataset

EOT = 6  # the EOT id of the hand-made caches (tests/formats/conftest.py)


def _windows(ds) -> list[list[int]]:
    return [s["input_ids"].tolist() + s["labels"][-1:].tolist() for s in ds]


def test_nanogpt_windows_advance_seq_len_plus_one_like_automodel(tmp_path):
    # NeMo AutoModel: pos = 0; while pos + T < n: yield tokens[pos:pos + T + 1]; pos += T + 1
    np.save(tmp_path / "a.npy", np.arange(10, 32, dtype="<u2"))  # 22 tokens
    got = _windows(NanogptDataset([str(tmp_path / "a.npy")], 4))
    assert got == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21, 22, 23, 24], [25, 26, 27, 28, 29]]


def test_nanogpt_bos_aligned_windows_look_for_the_next_bos_after_the_window_like_automodel(tmp_path):
    B = 1
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [B, 2, 3, B, 4, 5, 6, B, 7, B, 8, 9]
    np.save(tmp_path / "a.npy", np.asarray(tokens, dtype="<u2"))
    got = _windows(NanogptDataset([str(tmp_path / "a.npy")], 3, bos_token=B, align_to_bos=True))
    # window [0, 4); the next starts at the first BOS at or after 4 (index 7); [7, 11); none after 11
    assert got == [[B, 2, 3, B], [B, 7, B, 8]]


@pytest.mark.parametrize("dst", ["s3://bucket/x", "gs://b/y", "file:///tmp/z", "memory://m"])
def test_convert_refuses_a_url_destination_and_writes_nothing_local(small_cache, tmp_path, monkeypatch, dst, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"a URL as the destination; .*remote output is not supported by convert"):
        convert(small_cache, dst, to="raw")
    assert main(["convert", str(small_cache), dst, "--to", "kempner-npy"]) == 1
    err = capsys.readouterr().err
    assert dst in err and "remote output is not supported by convert" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no ./s3:/ directory


def test_convert_refuses_a_url_source(tmp_path):
    with pytest.raises(ConfigError, match="s3://bucket/src: a URL as the source"):
        convert("s3://bucket/src", tmp_path / "out", to="raw")
    assert not (tmp_path / "out").exists()


def test_is_url_is_a_scheme_not_a_drive():
    from niels_gpt.urls import is_url

    assert is_url("s3://b/k") and is_url("https://h/x") and is_url("file:///tmp/x")
    assert not is_url("C:\\\\data") and not is_url("C://data") and not is_url("out/s3:/x")


# -- prepare-data: every printed call runs as printed (item 6) -----------------------------------------

def _printed_calls(argv, capsys) -> tuple[list[str], str]:
    assert main(["prepare-data", *argv]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    imports = [ln for ln in lines if ln.startswith("from niels_gpt.")]
    calls = [ln for ln in lines if ln.startswith(("MemoryMappedDataset(", "NanogptDataset("))]
    assert len(imports) == 2 and calls
    return imports + calls, captured.err


def _run_printed(lines: list[str]) -> list:
    """Execute the printed lines as a user would paste them; every dataset must yield a sample."""
    scope: dict = {}
    made = []
    for line in lines:
        if line.startswith("from "):
            exec(line, scope)
            continue
        ds = eval(line, scope)
        n = len(ds)
        assert n > 0, line
        first = next(iter(ds)) if hasattr(ds, "align_to_bos") else ds[0]
        assert first["input_ids"].numel() and first["labels"].numel()
        if getattr(ds, "align_to_bos", False):
            assert all(int(s["input_ids"][0]) == ds.bos_token for s in ds)
        made.append(ds)
    return made


def test_printed_calls_run_on_our_cache_and_align_to_the_eot_not_the_tokenizer_bos(small_cache, capsys):
    lines, _ = _printed_calls([str(small_cache), "--seq-len", "2"], capsys)
    assert "bos_token=1" not in "\n".join(lines)  # <s> never occurs in our caches: zero windows
    made = _run_printed(lines)
    assert len(made) == 4  # train and val, two calls each
    assert any("align_to_bos=True" in ln and f"bos_token={EOT}" in ln for ln in lines)


def test_printed_calls_run_without_an_eos_id(tmp_path, capsys):
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "shard_00000.npy", np.arange(2, 40, dtype="<u2"))
    lines, _ = _printed_calls([str(d), "--seq-len", "4"], capsys)
    assert "pack_sequences" not in "\n".join(lines)
    _run_printed(lines)


def test_printed_calls_carry_the_dtype_a_headerless_bin_needs(tmp_path, capsys):
    d = tmp_path / "raw"
    d.mkdir()
    np.arange(2, 40, dtype="<u2").tofile(d / "a.bin")
    lines, _ = _printed_calls([str(d), "--seq-len", "4", "--dtype", "uint16", "--eot-id", "9"], capsys)
    assert all("dtype='uint16'" in ln for ln in lines if "(" in ln)
    _run_printed(lines)


def test_printed_calls_run_on_bos_prefixed_nanogpt_shards(small_cache, tmp_path, capsys):
    convert(small_cache, tmp_path / "n", to="nanogpt", bos_index=True)
    lines, _ = _printed_calls([str(tmp_path / "n"), "--seq-len", "2"], capsys)
    assert any("align_to_bos=True" in ln for ln in lines)
    _run_printed(lines)


# -- modded-nanogpt's folder (item 5) -------------------------------------------------------------------

BOS = 50256


def _modded_folder(path):
    """What modded-nanogpt's data/fineweb.py leaves: legacy-header shards, val first, <|endoftext|> first."""
    from niels_gpt.formats import nanogpt

    path.mkdir()
    shards = {"fineweb_val_000000.bin": [BOS, 5, 6, 7, BOS, 8, 9],
              "fineweb_train_000001.bin": [BOS, 10, 11, 12, BOS, 13, 14, 15, 16],
              "fineweb_train_000002.bin": [BOS, 17, 18, BOS, 19, 20, 21, 22, 23]}
    for name, toks in shards.items():
        (path / name).write_bytes(nanogpt.make_header(len(toks), "uint16", legacy=True)
                                  + np.asarray(toks, dtype="<u2").tobytes())
    return path


def test_modded_nanogpt_folder_splits_train_and_val(tmp_path, capsys, read_tokens):
    from niels_gpt.cache.formats import detect_format

    d = _modded_folder(tmp_path / "fineweb10B")
    info = detect_format(d)
    assert sorted(info.splits) == ["train", "val"] and info.format == "nanogpt-legacy"
    assert [p.rsplit("/", 1)[1] for p in info.splits["train"].files] == [
        "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    assert info.splits["val"].num_tokens == 7 and info.splits["train"].pattern == "fineweb_train_*.bin"
    lines, _ = _printed_calls([str(d), "--seq-len", "3", "--bos-id", str(BOS)], capsys)
    train_calls = lines[2:4]
    assert all("fineweb_train_" in ln and "fineweb_val_" not in ln for ln in train_calls)
    made = _run_printed(lines)
    train_tokens = {int(t) for ds in made[:2] for s in (ds if hasattr(ds, "align_to_bos") else [ds[i] for i in range(len(ds))])
                    for t in s["input_ids"]}
    assert not train_tokens & {5, 6, 7, 8, 9}  # nothing of the val shard reaches training
    convert(d, tmp_path / "k", to="kempner-npy", bos_id=BOS)
    assert read_tokens(tmp_path / "k") == {"train": [10, 11, 12, BOS, 13, 14, 15, 16, BOS, 17, 18, BOS,
                                                     19, 20, 21, 22, 23, BOS], "val": [5, 6, 7, BOS, 8, 9, BOS]}


# -- a .bos.idx that names no BOS id (item 4) -----------------------------------------------------------

def _shard_with_bad_sidecar(tmp_path):
    from niels_gpt.formats import nanogpt

    d = tmp_path / "ng"
    d.mkdir()
    toks = [BOS, 10, 11, BOS, 12, 13, BOS, 14]
    sink = nanogpt.NanogptSink(d / "data_000000.bin", "uint16")
    sink.write(np.asarray(toks))
    sink.close()
    np.asarray([0, 3, 5, 6], dtype="<i4").tofile(d / "data_000000.bos.idx")  # 5 holds 13: inside a document
    return d


def test_a_sidecar_that_disagrees_with_its_shard_is_refused_without_an_unchecked_id(tmp_path, capsys, read_tokens,
                                                                                     tokenizer):
    from niels_gpt.errors import FormatError

    d = _shard_with_bad_sidecar(tmp_path)
    disagrees = (r"the sidecar disagrees with the shard: its 4 positions do not all hold one token \(3 hold token "
                 r"50256, position 5 holds token 13\), so it does not say which id is the BOS; pass the BOS id of "
                 r"the tokenizer that made the shard \(--bos-id ID for convert and prepare-data")
    with pytest.raises(FormatError, match=disagrees):
        convert(d, tmp_path / "out", to="niels")
    assert not (tmp_path / "out").exists()
    assert main(["prepare-data", str(d), "--seq-len", "2"]) == 0
    err = capsys.readouterr().err
    assert "the sidecar disagrees with the shard" in err and "--bos-id 50256" not in err  # no id it did not check
    # with the tokenizer at hand, its BOS id is named (here the test tokenizer's <s>, 1)
    assert main(["prepare-data", str(d), "--seq-len", "2", "--tokenizer", tokenizer.model_path]) == 0
    assert f"pass the BOS id of the tokenizer {tokenizer.model_path}, 1 (--bos-id 1 for convert" in \
        capsys.readouterr().err
    with pytest.warns(UserWarning, match="do not land on BOS token 50256; ignoring the sidecar and scanning"):
        assert main(["prepare-data", str(d), "--seq-len", "2", "--bos-id", str(BOS)]) == 0
    convert(d, tmp_path / "out", to="kempner-npy", bos_id=BOS)
    assert read_tokens(tmp_path / "out") == {"-": [10, 11, BOS, 12, 13, BOS, 14, BOS]}


def test_an_automodel_sidecar_of_a_shard_quoting_its_bos_names_no_wrong_id(tmp_path, capsys):
    """The issue's case: BOS 0, documents that quote it, and a sidecar whose positions mostly hold another
    token (199): the old advice, --bos-id 199, named an id that is not the BOS at all."""
    from niels_gpt.formats import nanogpt

    d = tmp_path / "am"
    d.mkdir()
    docs = [[199, 5, 6], [199, 0, 7], [199, 8]]  # the middle document quotes the BOS
    toks = [t for doc in docs for t in (0, *doc)]
    sink = nanogpt.NanogptSink(d / "data_000000.bin", "uint16")
    sink.write(np.asarray(toks))
    sink.close()
    np.asarray([1, 5, 7, 9], dtype="<i4").tofile(d / "data_000000.bos.idx")  # one past each BOS: 199, 199, 7, 199
    assert main(["prepare-data", str(d), "--seq-len", "2"]) == 0
    err = capsys.readouterr().err
    assert "the sidecar disagrees with the shard" in err and "--bos-id 199" not in err


# -- Megatron prefixes (item 7) -------------------------------------------------------------------------

def test_a_megatron_prefix_is_accepted_wherever_a_path_is(small_cache, tmp_path, capsys, read_tokens):
    from niels_gpt.cache.formats import detect_format
    from niels_gpt.formats.kempner_dataset import MemoryMappedDataset

    convert(small_cache, tmp_path / "m", to="megatron")
    prefix = str(tmp_path / "m" / "train" / "train")
    assert detect_format(prefix).num_tokens == 10 and detect_format(prefix).path == prefix
    assert len(MemoryMappedDataset(prefix, 2, pack_sequences=True)) == 3
    assert len(list(NanogptDataset(prefix, 2))) == 3
    convert(prefix, tmp_path / "back", to="kempner-npy")
    assert read_tokens(tmp_path / "back") == {"-": read_tokens(small_cache)["train"]}
    lines, _ = _printed_calls([prefix, "--seq-len", "2"], capsys)
    _run_printed(lines)
    assert main(["prepare-data", str(tmp_path / "m"), "--seq-len", "2"]) == 0
    out = capsys.readouterr().out
    assert f"--data-path {prefix} " in out and f"--data-path {tmp_path / 'm' / 'val' / 'val'} " in out
    assert "<prefix>" not in out


def test_a_non_utf8_byte_in_metadata_yaml_is_one_package_error(small_cache, tmp_path, capsys):
    from niels_gpt.errors import FormatError
    from niels_gpt.formats.kempner_dataset import MemoryMappedDataset

    convert(small_cache, tmp_path / "k", to="kempner-npy")
    md = tmp_path / "k" / "train" / "metadata.yaml"
    data = bytearray(md.read_bytes())
    data[data.index(b"dtype")] = 0xFF
    md.write_bytes(bytes(data))
    match = r"metadata.yaml: byte \d+ is not UTF-8 \(0xff\); the file is corrupt"
    with pytest.raises(FormatError, match=match):
        MemoryMappedDataset(tmp_path / "k" / "train", 2)
    with pytest.raises(FormatError, match=match):
        NanogptDataset(str(tmp_path / "k" / "train"), 2)
    assert main(["prepare-data", str(tmp_path / "k")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is not UTF-8" in err and len(err.strip().splitlines()) == 1


# -- raw output that KempnerForge would misread (item 2) ------------------------------------------------

def _kempnerforge_reads(path) -> list[int]:
    """KempnerForge MemoryMappedDataset's rule for a .bin: uint32 if the size divides by 4, else uint16."""
    data = path.read_bytes()
    return np.frombuffer(data, dtype="<u4" if len(data) % 4 == 0 else "<u2").tolist()


def test_convert_to_raw_notes_uint16_files_kempnerforge_would_misread(small_cache, tmp_path, capsys, read_tokens):
    summary = convert(small_cache, tmp_path / "raw", to="raw")
    assert len(summary["notes"]) == 1 and re.search(r"shard_00000.bin: 10 tokens\), which KempnerForge's "
                                                    r"MemoryMappedDataset reads as uint32.*use --to kempner-npy",
                                                    summary["notes"][0])
    assert read_tokens(tmp_path / "raw") == read_tokens(small_cache)  # written: readers told the dtype read it
    assert main(["convert", str(small_cache), str(tmp_path / "raw"), "--to", "raw"]) == 0
    assert "--to kempner-npy" in capsys.readouterr().err
    # declared for a reader that is told the dtype: no note
    assert convert(small_cache, tmp_path / "raw", to="raw", not_for_kempnerforge=True)["notes"] == []
    # KempnerForge-bound output is .npy: its dtype is in the header, whatever the size
    convert(small_cache, tmp_path / "k", to="kempner-npy")
    for f in sorted((tmp_path / "k").rglob("*.npy")):
        assert np.load(f).dtype == np.dtype("<u2")
    assert read_tokens(tmp_path / "k") == read_tokens(small_cache)


def test_raw_uint16_with_odd_counts_and_uint32_raw_read_right_under_kempnerforges_rule(tmp_path, cache_maker):
    odd = cache_maker(tmp_path / "odd", {"train": [[10, 11, EOT]], "val": [[12, EOT, 13, 14, EOT]]})
    convert(odd, tmp_path / "raw", to="raw")
    for split, want in (("train", [10, 11, EOT]), ("val", [12, EOT, 13, 14, EOT])):
        (f,) = sorted((tmp_path / "raw" / split).glob("*.bin"))
        assert _kempnerforge_reads(f) == want
    convert(odd, tmp_path / "raw32", to="raw", dtype="uint32")  # uint32: every size divides by 4, read right
    (f,) = sorted((tmp_path / "raw32" / "train").glob("*.bin"))
    assert _kempnerforge_reads(f) == [10, 11, EOT]
