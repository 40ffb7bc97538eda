"""Every command asks niels_gpt.locate what a path holds, so a path is the same thing to each of them."""

from __future__ import annotations

import numpy as np
import pytest

from niels_gpt.data import open_dataset
from niels_gpt.errors import ConfigError, TokenizerError
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.locate import locate
from niels_gpt.packing import open_packed
from niels_gpt.packing.legacy import LegacyPackedDataset, LegacyPickleWarning
from niels_gpt.report import cache_stats
from niels_gpt.train.data import detect_kind


def test_a_token_npy_file_is_a_peer_output_to_every_command(tmp_path):
    # A KempnerForge .npy of token ids was "packed" to locate, train and open_dataset (which then asked for
    # allow_pickle) but a converted output to stats; it is a converted output to all of them now.
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(100, dtype=np.uint16))
    found = locate(path)
    assert (found.kind, found.meta["format"]) == ("foreign", found.info.format)
    ds = open_dataset(path, T=9)
    assert isinstance(ds, MemoryMappedDataset) and len(ds) == 10
    assert cache_stats(path).streams[0].tokens == 100
    with pytest.raises(ConfigError, match="token files of another format"):
        detect_kind(path)
    with pytest.raises(Exception, match="holds foreign data, not packed SFT bins"):
        open_packed(path)


def test_a_pickled_npy_file_is_legacy_packed_bins_to_every_command(tmp_path):
    path = tmp_path / "bins.npy"
    np.save(path, np.array([{"input_ids": [1, 2], "loss_mask": [0, 1], "seq_start_id": [0]}], dtype=object),
            allow_pickle=True)
    found = locate(path)
    assert (found.kind, found.layout) == ("packed", "npy")
    assert detect_kind(path) == "packed"
    with pytest.warns(LegacyPickleWarning):
        assert isinstance(open_packed(path, allow_pickle=True), LegacyPackedDataset)
    with pytest.raises(Exception, match="legacy pickled packed bins; convert them once"):
        cache_stats(path)


def test_packed_bins_at_a_url_open_like_the_local_ones(s3, tmp_path):
    # A URL's kind is locate's too, read from its mirrored marker: packed bins at a URL opened as packed bins
    # (open_packed took the URL for a local path and refused it).
    from niels_gpt.packing import pack_sft
    from niels_gpt.storage import upload_tree

    from .conftest import SPECIALS, write_sft_cache

    _, bucket = s3
    u, a, e = SPECIALS["usr"], SPECIALS["asst"], SPECIALS["eot"]
    write_sft_cache(tmp_path / "sft", [[u, 10 + i, 11, a, 20 + i, 21, e] for i in range(40)])
    pack_sft(tmp_path / "sft", tmp_path / "packed", pack_size=32)
    upload_tree(tmp_path / "packed", f"{bucket}/packed")
    local, remote = open_dataset(tmp_path / "packed"), open_dataset(f"{bucket}/packed")
    assert len(remote) == len(local) > 0
    assert np.array_equal(np.asarray(remote[1]["input_ids"]), np.asarray(local[1]["input_ids"]))
    with pytest.raises(ConfigError, match="packed bins have the length they were packed with"):
        open_dataset(f"{bucket}/packed", T=32)


def test_a_split_directory_is_its_cache_to_verify_inspect_and_stats(tmp_path):
    # cache/train: locate and stats said "the train split of a pretrain cache"; verify said "no meta.json ...
    # found: not a cache" and inspect "no meta.json: the build was interrupted". All say the cache now.
    from niels_gpt.report import inspect_json, inspect_path, verify_outputs

    from .conftest import write_pretrain_cache

    cache = write_pretrain_cache(tmp_path / "c", {"train": [np.arange(1, 200)], "val": [np.arange(1, 50)]})
    assert locate(cache / "train").split == "train"
    problems, checked, seen = verify_outputs(str(cache / "train"))
    assert (problems, checked) == ([], 1) and seen[0].startswith(f"{cache}: pretrain cache")
    with pytest.raises(TokenizerError, match="no tokenizer with sha256"):  # it reached the cache's own step
        inspect_path(str(cache / "train"), window=8)
    assert str(cache) in inspect_json(str(cache / "train"))
    assert cache_stats(cache / "train").streams[0].name == "train"


def test_a_text_file_is_a_text_file_to_convert_and_prepare_data_too(tmp_path):
    # wiki.train.raw: locate said "a text file: build it first"; convert and prepare-data, which open token
    # files with detect_format, said "a headerless .bin does not record its dtype". detect_format says it now.
    from niels_gpt.errors import FormatError
    from niels_gpt.formats.convert import convert
    from niels_gpt.formats.prepare import report

    text = tmp_path / "wiki.train.raw"
    text.write_text(" = Valkyria Chronicles = \n" * 20)
    for call in (lambda: locate(text), lambda: convert(text, tmp_path / "out", to="nanogpt"),
                 lambda: report(str(text), seq_len=8), lambda: cache_stats(text)):
        with pytest.raises(FormatError, match=r"a text file, not a token cache: build one from it first"):
            call()
    assert not (tmp_path / "out").exists()
