"""stats: every figure checked against an independent computation over the same files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from niels_gpt.cache.cli import main
from niels_gpt.report import cache_stats, format_stats, plot_stats
from tests.conftest import SPECIALS, write_pretrain_cache, write_sft_cache

EOT, ASST, USR = SPECIALS["eot"], SPECIALS["asst"], SPECIALS["usr"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _docs(rng, n, lo=1, hi=300):
    return [np.append(rng.integers(10, 2000, size=int(rng.integers(lo, hi))), EOT) for _ in range(n)]


@pytest.fixture
def pretrain(tmp_path):
    rng = np.random.default_rng(0)
    train, val = np.concatenate(_docs(rng, 120)), np.concatenate(_docs(rng, 17))
    # the train split in two shards cut inside a document: documents run across shard ends
    return write_pretrain_cache(tmp_path / "pretrain" / "p", {"train": [train[:5000], train[5000:]], "val": [val]})


def _sft_examples(rng, n):
    out = []
    for _ in range(n):
        prompt = rng.integers(10, 2000, size=int(rng.integers(1, 200)))
        answer = rng.integers(10, 2000, size=int(rng.integers(1, 50)))
        out.append([USR, *prompt, EOT, ASST, *answer, EOT])
    return out


@pytest.fixture
def sft(tmp_path):
    rng = np.random.default_rng(1)
    return write_sft_cache(tmp_path / "sft" / "s", _sft_examples(rng, 60), _sft_examples(rng, 9))


def _independent_pretrain(path):
    arrs = [np.fromfile(p, dtype="<u2") for p in sorted(path.glob("shard_*.bin"))]
    flat = np.concatenate(arrs)
    ends = np.flatnonzero(flat == EOT)
    lengths = np.diff(np.concatenate([[-1], ends]))
    return flat, lengths


def test_pretrain_figures_match_numpy(pretrain):
    st = cache_stats(pretrain)
    assert st.kind == "pretrain" and [s.name for s in st.streams] == ["train", "val"]
    for s in st.streams:
        flat, lengths = _independent_pretrain(pretrain / s.name)
        assert s.tokens == len(flat)
        assert s.eot == int((flat == EOT).sum()) == s.documents == len(lengths)
        assert s.bos == int((flat == 1).sum())
        for p in (50, 90, 99):
            assert s.lengths[f"p{p}"] == pytest.approx(np.percentile(lengths, p))
        assert s.lengths["max"] == lengths.max()
        assert sum(s.hist_counts) == len(lengths)
    # a split directory alone gives the same figures for that split
    assert cache_stats(pretrain / "val").streams[0] == st.streams[1]


def test_sft_trained_fraction_and_losses_match_per_example_loop(sft):
    st = cache_stats(sft, seq_len=64)
    for s in st.streams:
        tokens = np.fromfile(sft / f"{s.name}_tokens.bin", dtype="<u2")
        idx = np.load(sft / f"{s.name}_idx.npy")
        ends = np.append(idx[1:], len(tokens))
        trained, lost = 0, 0
        for a, b in zip(idx, ends, strict=True):
            ex = tokens[a:b].tolist()
            inside, mask = False, []
            for t in ex:  # the rule, token by token: inside after [asst] until the next EOT (inclusive)
                mask.append(inside)
                if t == ASST:
                    inside = True
                elif t == EOT:
                    inside = False
            trained += sum(mask)
            lost += not any(mask[1:65])
        assert s.documents == len(idx) and s.tokens == len(tokens)
        assert s.trained_tokens == trained
        assert s.trained_fraction == pytest.approx(trained / len(tokens))
        assert s.lose_all_trained == lost
        assert s.eot == int((tokens == EOT).sum())
        assert s.lengths["p90"] == pytest.approx(np.percentile(np.diff(np.append(idx, len(tokens))), 90))
    assert cache_stats(sft, seq_len=100_000).streams[0].lose_all_trained == 0


def test_sft_split_without_any_assistant_token_counts_every_example_lost(tmp_path):
    sft = write_sft_cache(tmp_path / "s", [[USR, 10, 11, EOT], [USR, 12, EOT]])
    s = cache_stats(sft, seq_len=8).streams[0]
    assert (s.trained_tokens, s.trained_fraction, s.lose_all_trained) == (0, 0.0, 2)


def test_root_of_caches_lists_every_split(pretrain, sft):
    root = pretrain.parents[1]
    st = cache_stats(root)
    assert [s.name for s in st.streams] == ["pretrain/p/train", "pretrain/p/val", "sft/s/train", "sft/s/val"]
    assert st.tokens == cache_stats(pretrain).tokens + cache_stats(sft).tokens


def test_packed_efficiency_and_fill(sft, tmp_path):
    from niels_gpt.packing import pack_sft

    out = tmp_path / "packed"
    pack_sft(str(sft), str(out), pack_size=512, algorithm="ffd", split="train", on_overflow="truncate", seed=0)
    st = cache_stats(out)
    plen = np.load(out / "packed_len.npy")
    assert st.kind == "packed" and st.extra["bins"] == len(plen)
    assert st.extra["efficiency"] == pytest.approx(plen.sum() / (len(plen) * 512))
    assert st.extra["fill_counts"] == np.histogram(plen / 512, bins=20, range=(0, 1))[0].tolist()
    assert st.streams[0].documents == len(np.load(out / "seq_starts.npy"))
    assert st.streams[0].trained_tokens == int(np.load(out / "loss_mask.npy").sum())
    assert "efficiency" in format_stats(st)


def test_packed_parquet_has_the_figures_of_the_bins_it_holds(sft, tmp_path):
    """Megatron-Bridge Parquet rows: the same bins give the same figures as the memmap directory, measured
    against the longest bin (the rows record no pack size)."""
    from niels_gpt.packing import open_packed, pack_sft, write_packed_parquet

    out = tmp_path / "packed"
    pack_sft(str(sft), str(out), pack_size=512, algorithm="ffd", split="train", on_overflow="truncate", seed=0)
    write_packed_parquet(open_packed(out), tmp_path / "pq" / "bins.parquet")
    memmap, parquet = cache_stats(out), cache_stats(tmp_path / "pq")
    assert parquet.kind == "packed" and parquet.extra["bins"] == memmap.extra["bins"]
    longest = int(np.load(out / "packed_len.npy").max())
    assert parquet.extra["pack_size"] == longest
    assert parquet.extra["efficiency"] == pytest.approx(memmap.extra["efficiency"] * 512 / longest)
    for a, b in ((parquet.streams[0], memmap.streams[0]),):
        assert (a.tokens, a.documents, a.trained_tokens, a.lengths) == (b.tokens, b.documents, b.trained_tokens, b.lengths)
    assert cache_stats(tmp_path / "pq" / "bins.parquet").extra["bins"] == memmap.extra["bins"]


def test_png_files_hold_the_computed_figures(pretrain, tmp_path):
    pytest.importorskip("matplotlib")
    st = cache_stats(pretrain)
    drawn = plot_stats(st, tmp_path / "png")
    assert set(drawn) == {"tokens.png", "lengths.png", "token_share.png"}  # one source: one figure of each
    for name in drawn:
        assert (tmp_path / "png" / name).read_bytes()[:8] == PNG_MAGIC
    for split in ("train", "val"):
        _, lengths = _independent_pretrain(pretrain / split)
        wide = lengths.max() / lengths.min() >= 100
        edges = (np.geomspace(lengths.min(), lengths.max() + 1, 41) if wide else
                 np.histogram(lengths, bins=len(drawn["lengths.png"]["splits"][split]["counts"]))[1])
        counts, _ = np.histogram(lengths, bins=edges)
        assert drawn["lengths.png"]["splits"][split]["counts"] == counts.tolist()
        assert drawn["lengths.png"]["splits"][split]["edges"] == pytest.approx(edges.tolist())
        tokens, _ = np.histogram(lengths, bins=edges, weights=lengths)
        assert drawn["token_share.png"]["splits"][split]["shares"] == pytest.approx((tokens / lengths.sum()).tolist())
    assert drawn["lengths.png"]["log"] is True  # the fixture's documents run from 2 to 300 tokens
    assert drawn["tokens.png"]["tokens"] == [s.tokens for s in st.streams]


def test_wide_length_ranges_are_binned_on_a_log_scale(tmp_path):
    pytest.importorskip("matplotlib")
    books = [np.append(np.full(n, 50), EOT) for n in (4, 9, 30, 200, 880_000)]  # notes beside a whole book
    wide = write_pretrain_cache(tmp_path / "wide", {"train": [np.concatenate(books)]})
    drawn = plot_stats(cache_stats(wide), tmp_path / "png")["lengths.png"]
    counts, edges = drawn["splits"]["train"]["counts"], drawn["splits"]["train"]["edges"]
    assert drawn["log"] is True and edges[0] == 5 and edges[-1] == 880_002
    assert counts[0] == 1 and counts[-1] == 1 and sum(counts) == 5  # the short notes are not one bar
    narrow = write_pretrain_cache(tmp_path / "narrow", {"train": [np.concatenate(books[:3])]})
    assert plot_stats(cache_stats(narrow), tmp_path / "png2")["lengths.png"]["log"] is False


def test_a_root_gets_one_figure_per_source_and_sft_marks_what_seq_len_cuts(pretrain, sft, tmp_path):
    pytest.importorskip("matplotlib")
    drawn = plot_stats(cache_stats(tmp_path, seq_len=64), tmp_path / "png")
    assert set(drawn) == {"tokens.png", "lengths_pretrain_p.png", "token_share_pretrain_p.png",
                          "lengths_sft_s.png", "token_share_sft_s.png"}
    assert sorted(drawn["lengths_sft_s.png"]["splits"]) == ["train", "val"]
    chart = drawn["lengths_sft_s.png"]
    offsets = np.load(sft / "train_idx.npy")
    lengths = np.diff(np.append(offsets, (sft / "train_tokens.bin").stat().st_size // 2))
    assert chart["seq_len"] == 64 and chart["cut_share"]["train"] == pytest.approx((lengths > 65).mean())
    assert drawn["lengths_pretrain_p.png"]["seq_len"] is None
    for name in ("token_share_pretrain_p.png", "token_share_sft_s.png"):
        assert all(sum(v["shares"]) == pytest.approx(1.0) for v in drawn[name]["splits"].values())


def test_cli_text_json_and_png(pretrain, sft, tmp_path, capsys):
    assert main(["stats", str(sft), "--seq-len", "64"]) == 0
    text = capsys.readouterr().out
    assert "trained tokens" in text and "no trained token at T=64" in text and "examples" in text
    assert "cut at T=64" in text
    assert main(["stats", str(pretrain), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"] == cache_stats(pretrain).tokens
    pytest.importorskip("matplotlib")
    assert main(["stats", str(pretrain), "--png", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "tokens.png").read_bytes()[:8] == PNG_MAGIC


def test_rejections_name_the_path(tmp_path, sft, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello")
    assert main(["stats", str(plain)]) == 1
    assert f"{plain}: no meta.json" in capsys.readouterr().err
    assert main(["stats", str(tmp_path / "missing")]) == 1
    assert f"{tmp_path / 'missing'}: no such file" in capsys.readouterr().err
    assert main(["stats", str(sft), "--seq-len", "0"]) == 1
    assert f"{sft}: --seq-len must be a positive integer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stats", str(sft), "--seq-len", "abc"])
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "x_tokens.bin").write_bytes(b"\0\0")
    assert main(["stats", str(unknown)]) == 1
    assert str(unknown) in capsys.readouterr().err


def test_png_without_matplotlib_names_the_extra(pretrain, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "matplotlib":
            raise ImportError("no matplotlib")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    from niels_gpt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"niels_gpt\[plot\]"):
        plot_stats(cache_stats(pretrain), tmp_path / "png")


@pytest.mark.parametrize("fmt", ["nanogpt", "megatron"])
def test_converted_output_has_the_figures_of_its_source(pretrain, tmp_path, fmt, capsys):
    out = tmp_path / fmt
    assert main(["convert", str(pretrain), str(out), "--to", fmt]) == 0
    capsys.readouterr()
    ours, theirs = cache_stats(pretrain), cache_stats(out)
    assert theirs.kind == fmt
    for a, b in zip(ours.streams, theirs.streams, strict=True):
        assert (a.name, a.tokens, a.documents, a.eot, a.lengths) == (b.name, b.tokens, b.documents, b.eot, b.lengths)


def test_mixture_realised_proportions_are_what_the_sampler_draws(pretrain, tmp_path, capsys):
    from collections import Counter

    from niels_gpt.loading.mixture import MixtureConfig
    from niels_gpt.report import mixture_stats

    cfg = tmp_path / "mix.json"
    cfg.write_text(json.dumps({"datasets": {"a": str(pretrain), "b": str(pretrain)}, "seed": 3,
                               "phases": [{"start_step": 0, "weights": {"a": 3, "b": 1}},
                                          {"start_step": 10, "weights": {"a": 1, "b": 1}}]}))
    st = mixture_stats(cfg, steps=25, global_batch_size=7)
    _, sampler = MixtureConfig.from_file(cfg).build(16, 7)
    seen = Counter()
    for step in range(25):
        seen.update(d for d, _ in sampler.global_batch())
        drawn = np.array([seen[0], seen[1]]) / (7 * (step + 1))
        assert st.extra["realised_over_steps"][step] == pytest.approx(drawn.tolist())
    assert [s.tokens for s in st.streams] == [seen[0], seen[1]]
    assert st.extra["realised"]["a"] == pytest.approx((10 * 7 * 0.75 + 15 * 7 * 0.5) / 175, abs=1 / 175)
    assert main(["stats", str(cfg), "--steps", "25", "--batch", "7"]) == 0
    assert "realised" in capsys.readouterr().out
    assert main(["stats", str(cfg), "--steps", "0"]) == 1
    assert f"{cfg}: --steps must be a positive integer" in capsys.readouterr().err
    if pytest.importorskip("matplotlib"):
        drawn = plot_stats(st, tmp_path / "png")
        assert np.array_equal(drawn["mixture.png"]["realised"], np.asarray(st.extra["realised_over_steps"]))


def test_an_unfinished_cache_is_named_unfinished_in_one_line(pretrain, tmp_path):
    """stats says what verify and the readers say of a cache that has no commit marker: never 'not a cache'."""
    import os
    import shutil
    import subprocess
    import sys

    from niels_gpt.errors import IncompleteCacheError

    gone = tmp_path / "gone"
    shutil.copytree(pretrain, gone)
    (gone / "meta.json").unlink()  # token files, no marker
    for path in (gone, gone / "train"):
        with pytest.raises(IncompleteCacheError, match=r"token files but no meta\.json .*: unfinished build"):
            cache_stats(path)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # a pid that is no longer running: its build died
    shutil.copytree(gone, tmp_path / f"first.tmp-{p.pid}")  # a first build killed before its swap
    with pytest.raises(IncompleteCacheError, match=r"first: its build was interrupted before it finished"):
        cache_stats(tmp_path / "first")
    shutil.copytree(gone, tmp_path / f"busy.tmp-{os.getpid()}")  # a build still running
    with pytest.raises(IncompleteCacheError, match=r"busy: a build of it is still running"):
        cache_stats(tmp_path / "busy")
