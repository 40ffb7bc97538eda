"""`stats`: every figure checked against an independent computation on real caches, the pictures
against the figures, and each refusal named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from niels_gpt.cache.build_cache import build_pretrain_cache, build_sft_cache
from niels_gpt.cache.cli import main
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.errors import NielsGPTError
from niels_gpt.formats.convert import convert
from niels_gpt.packing.pack import pack_sft
from niels_gpt.stats import cache_stats, plot

from ..conftest import sample_texts

CHATS = [[{"role": "user", "content": f"Tell me about item {i}. " + "Some context. " * (i % 7)},
          {"role": "assistant", "content": f"Item {i} is " + "quite interesting. " * (1 + i % 5)}]
         for i in range(40)]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("stats")
    build_pretrain_cache([t for t in sample_texts() if t.strip()], str(root / "pre"), tokenizer=tokenizer,
                         max_train_tokens=30_000, max_val_tokens=3_000, shard_bytes=8192, seed=0,
                         shuffle_buffer=None, progress=False, num_workers=1)
    build_sft_cache(CHATS, str(root / "sft"), tokenizer=tokenizer, val_frac=0.2, seed=0)
    pack_sft(root / "sft", root / "packed", pack_size=96)
    convert(root / "pre", root / "nano", to="nanogpt")
    return root


def _stream(root: Path, split: str) -> np.ndarray:
    return np.concatenate([np.fromfile(p, dtype="<u2") for p in sorted((root / split).glob("shard_*.bin"))])


def test_pretraining_figures_match_the_raw_shards(data, tokenizer):
    fig = cache_stats(data / "pre")
    eot = tokenizer.special_ids["eot"]
    for split in ("train", "val"):
        tokens = _stream(data / "pre", split)
        s = fig["splits"][split]
        assert s["tokens"] == len(tokens) and s["eot_tokens"] == int((tokens == eot).sum())
        ends = np.flatnonzero(tokens == eot)
        lengths = np.diff(np.concatenate([[-1], ends]))
        assert s["documents"] == len(lengths) == len(ends)
        d = s["document_length"]
        assert d["max"] == lengths.max() and d["p50"] == pytest.approx(np.median(lengths))
        assert d["p90"] == pytest.approx(np.percentile(lengths, 90))
        assert sum(d["histogram"]["counts"]) == len(lengths)
        edges = d["histogram"]["edges"]
        for a, b, c in zip(edges[:-1], edges[1:], d["histogram"]["counts"], strict=True):
            inside = (lengths >= a) & ((lengths < b) | ((b == edges[-1]) & (lengths == b)))  # last bin closed
            assert c == int(inside.sum())
    assert fig["tokens"] == sum(len(_stream(data / "pre", s)) for s in ("train", "val"))
    assert cache_stats(data / "pre" / "val")["splits"].keys() == {"val"}  # a split directory: that split


def test_a_peers_files_give_the_same_figures_as_the_cache_they_came_from(data):
    ours, theirs = cache_stats(data / "pre"), cache_stats(data / "nano")
    assert theirs["kind"] == "nanogpt"
    for split in ("train", "val"):
        for key in ("tokens", "documents", "eot_tokens", "document_length"):
            assert theirs["splits"][split][key] == ours["splits"][split][key], (split, key)


@pytest.mark.parametrize("T", [16, 48])
def test_sft_figures_match_what_the_dataset_trains_on(data, tokenizer, T):
    fig = cache_stats(data / "sft", seq_len=T)
    for split in ("train", "val"):
        ds = SFTExampleDataset(str(data / "sft" / f"{split}_tokens.bin"), str(data / "sft" / f"{split}_idx.npy"),
                               T=T, device="cpu", eot_id=tokenizer.special_ids["eot"])
        s = fig["splits"][split]
        idx = np.load(data / "sft" / f"{split}_idx.npy")
        size = (data / "sft" / f"{split}_tokens.bin").stat().st_size // 2
        lengths = np.diff(np.append(idx, size))
        assert s["examples"] == len(idx) and s["tokens"] == lengths.sum() == size
        # the trained targets of every example, through the batch path: y_masked of a window of T + 1
        _, _, y_masked = ds.collate(np.arange(len(ds)))
        full = SFTExampleDataset(str(data / "sft" / f"{split}_tokens.bin"), str(data / "sft" / f"{split}_idx.npy"),
                                 T=int(lengths.max()), device="cpu", eot_id=tokenizer.special_ids["eot"])
        _, _, y_all = full.collate(np.arange(len(full)))
        has = (y_all != -100).any(dim=1)
        assert s["examples_losing_all_trained_tokens"] == int((has & (y_masked == -100).all(dim=1)).sum())
        assert s["examples_without_trained_tokens"] == int((~has).sum())
        assert s["examples_longer_than_seq_len"] == int((lengths > T + 1).sum())
        assert 0 < s["trained_fraction"] < 1
    assert fig["splits"]["train"]["examples_losing_all_trained_tokens"] >= (1 if T == 16 else 0)


def test_packed_figures_match_the_manifest_and_the_arrays(data):
    fig = cache_stats(data / "packed")
    m = json.loads((data / "packed" / "manifest.json").read_text())
    filled = np.load(data / "packed" / "packed_len.npy")
    assert fig["bins"] == m["num_bins"] == len(filled) and fig["sequences"] == m["num_sequences"]
    assert fig["tokens"] == filled.sum() and fig["efficiency"] == pytest.approx(m["efficiency"])
    assert sum(fig["fill"]["counts"]) == len(filled)
    top = np.histogram(filled / m["pack_size"], bins=np.linspace(0, 1, 11))[0]
    assert fig["fill"]["counts"] == top.tolist()


def test_png_draws_exactly_the_computed_histograms(data, tmp_path):
    pytest.importorskip("matplotlib")
    for path, names in ((data / "pre", {"train_lengths.png", "val_lengths.png"}), (data / "packed", {"fill.png"})):
        fig = cache_stats(path)
        drawn = plot(fig, tmp_path / path.name)
        assert set(drawn) == names
        for name, arrays in drawn.items():
            assert (tmp_path / path.name / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            h = fig["fill"] if name == "fill.png" else fig["splits"][name.split("_")[0]]["document_length"]["histogram"]
            assert arrays["counts"] == h["counts"] and arrays["edges"] == pytest.approx(h["edges"])


def test_the_command_prints_tables_json_and_pictures(data, tmp_path, capsys):
    assert main(["stats", str(data / "pre"), "--png", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    fig = cache_stats(data / "pre")
    assert f"{fig['tokens']:,} tokens" in out and f"{fig['splits']['train']['documents']:,} documents" in out
    assert (tmp_path / "figs" / "train_lengths.png").is_file()
    assert main(["stats", str(data / "sft"), "--seq-len", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(cache_stats(data / "sft", seq_len=16)))


def test_refusals_name_the_path(data, tokenizer, tmp_path, capsys):
    with pytest.raises(NielsGPTError, match="nowhere: no such file"):
        cache_stats(tmp_path / "nowhere")
    with pytest.raises(NielsGPTError, match="holds no tokens to count"):
        cache_stats(Path(tokenizer.model_path).parent)
    with pytest.raises(NielsGPTError, match="seq_len=0"):
        cache_stats(data / "sft", seq_len=0)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hi\n")
    assert main(["stats", str(tmp_path / "plain")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "plain" in err[0]


def test_inspect_prints_totals_as_a_table(data, tokenizer, capsys):
    assert main(["inspect", str(data / "pre"), "--tokenizer", str(tokenizer.model_path)]) == 0
    out = capsys.readouterr().out
    meta = json.loads((data / "pre" / "meta.json").read_text())
    lines = out.splitlines()
    head = lines.index("  totals:") + 1
    assert lines[head].split() == ["split", "documents", "tokens"] or lines[head].split() == ["split", "tokens",
                                                                                             "documents"]
    cols = lines[head].split()[1:]
    for row, split in zip(lines[head + 1:head + 3], ("train", "val"), strict=True):
        cells = row.split()
        assert cells[0] == split
        for c, v in zip(cols, cells[1:], strict=True):
            assert int(v.replace(",", "")) == meta["totals"][f"{split}_{c}"]
    assert "{'train" not in out  # no raw dict
