"""--on-overflow split: a conversation longer than the pack size becomes pieces of whole turns, each keeping
the system prompt; deterministic; a turn too long on its own is cut and counted."""

import json

import numpy as np
import pytest

from niels_gpt.cli import main
from niels_gpt.errors import ConfigError
from niels_gpt.meta import file_record, write_meta
from niels_gpt.packing import open_packed, pack_sft
from niels_gpt.packing.pack import split_example
from niels_gpt.spans import assistant_token_mask

from ..conftest import SHARED_DATA, SPECIALS, needs_shared, write_sft_cache
from .helpers import ASST, EOT, SYS, USR

ARRAYS = ("input_ids", "loss_mask", "packed_len", "seq_offsets", "seq_starts")


def turn(role: int, n: int, base: int) -> list[int]:
    return [role, *range(base, base + n), EOT]


def conversation(i: int, exchanges: int, system: int = 5) -> list[int]:
    out = turn(SYS, system, 100 + i) if system else []
    for k in range(exchanges):
        out += turn(USR, 6 + k % 3, 200 + 10 * k) + turn(ASST, 9 + k % 4, 600 + 10 * k)
    return out


def _sequences(ds):
    out = []
    for i in range(len(ds)):
        it = ds[i]
        b = it["seq_boundaries"].tolist()
        out += [(it["input_ids"][s:e].tolist(), it["loss_mask"][s:e].tolist()) for s, e in zip(b[:-1], b[1:], strict=True)]
    return out


def test_long_conversations_become_whole_turn_pieces_with_their_system_prompt(tmp_path):
    short = [conversation(i, 1) for i in range(5)]
    long = [conversation(50 + i, 6) for i in range(3)]  # 6 exchanges of ~29 tokens, 7 system tokens: over 64
    cache = write_sft_cache(tmp_path / "c", short + long)
    m = pack_sft(cache, tmp_path / "p", pack_size=64, on_overflow="split")
    t = m["truncation"]
    assert t["tokens_lost"] == 0 and t["trained_targets_lost"] == 0 and m["truncated"] == 0
    assert t["split_examples"] == 3 and m["num_sequences"] == 5 + t["split_pieces"]
    seqs = _sequences(open_packed(tmp_path / "p"))
    for conv in long:
        system = conv[:7]
        pieces = [ids for ids, _ in seqs if ids[:7] == system]
        assert len(pieces) >= 2 and all(len(p) <= 64 for p in pieces)
        assert all(p[7] == USR for p in pieces)  # every piece opens with a question, after the system prompt
        assert system + [t for p in sorted(pieces, key=lambda p: p[8]) for t in p[7:]] == conv  # nothing lost
        assert t["prompt_tokens_repeated"] >= 7
    for ids, mask in seqs:  # each piece's mask is the span rule on the piece alone, shifted within it
        want = assistant_token_mask(np.asarray(ids), ASST, EOT)
        assert mask == [*want[1:].astype(int).tolist(), 0]


def test_split_packs_byte_identical_across_runs(tmp_path):
    cache = write_sft_cache(tmp_path / "c", [conversation(i, 1 + i % 7) for i in range(40)])
    for out in ("a", "b"):
        assert main(["pack-sft", str(cache), str(tmp_path / out), "--pack-size", "64", "--on-overflow", "split",
                     "--algorithm", "first_fit_shuffle", "--seed", "5"]) == 0
    for name in ARRAYS:
        assert (tmp_path / "a" / f"{name}.npy").read_bytes() == (tmp_path / "b" / f"{name}.npy").read_bytes()


def test_an_exchange_longer_than_the_room_is_cut_and_counted():
    tokens = np.asarray(turn(SYS, 3, 100) + turn(USR, 4, 200) + turn(ASST, 40, 600) + turn(USR, 2, 300)
                        + turn(ASST, 3, 700))
    prefix, kept, lost = split_example(tokens, 24, SYS, USR, (SYS, USR, ASST))
    assert prefix == 5
    assert kept == [(5, 5 + 19), (5 + 6 + 42, len(tokens))]  # the question and what fits of its answer; the rest
    assert lost == [(5 + 19, 5 + 6 + 42)]
    covered = sorted(kept + lost)
    assert all(a[1] == b[0] for a, b in zip(covered[:-1], covered[1:], strict=True))  # each token kept or lost once


def test_the_cut_turn_is_in_the_manifest_figures(tmp_path):
    conv = turn(SYS, 3, 100) + turn(USR, 4, 200) + turn(ASST, 80, 600) + turn(USR, 2, 300) + turn(ASST, 3, 700)
    cache = write_sft_cache(tmp_path / "c", [conv, conversation(1, 1)])
    m = pack_sft(cache, tmp_path / "p", pack_size=48, on_overflow="split", warn=False)
    assert m["truncated"] == 1 and m["truncation"]["tokens_lost"] == 6 + 82 - (48 - 5)  # the question stays
    assert m["truncation"]["trained_targets_lost"] == 6 + 82 - (48 - 5)


def template_cache(tmp_path):
    """An SFT cache rendered by a chat template: no role sentinel ids, a stored mask."""
    cache = write_sft_cache(tmp_path / "c", [conversation(1, 9)])
    meta = json.loads((cache / "meta.json").read_text())
    meta["special_token_ids"] = {"sys": None, "usr": None, "asst": None, "eot": SPECIALS["eot"]}
    np.ones(len(conversation(1, 9)), np.uint8).tofile(cache / "train_mask.bin")
    meta["files"]["train_mask.bin"] = file_record(cache / "train_mask.bin", None)
    write_meta(str(cache), meta)
    return cache


def test_a_cache_without_role_sentinels_is_refused(tmp_path):
    cache = template_cache(tmp_path)
    with pytest.raises(ConfigError, match="role sentinel"):
        pack_sft(cache, tmp_path / "p", pack_size=64, on_overflow="split")


@needs_shared
@pytest.mark.real_data
def test_real_oasst1_at_512_split_loses_less_than_truncate(tmp_path, tokenizer):
    from niels_gpt.cache.build_cache import build_sft_cache
    from niels_gpt.sources.corpus import corpus

    trees = SHARED_DATA / "oasst1" / "oasst_pre_release.en_100_tree.jsonl"
    convs = list(corpus([trees], layout="oasst", chat=True).iter_conversations())
    build_sft_cache(convs, str(tmp_path / "sft"), tokenizer=tokenizer, val_frac=0.0, seed=0)
    cut = pack_sft(tmp_path / "sft", tmp_path / "t", pack_size=512, warn=False)
    split = pack_sft(tmp_path / "sft", tmp_path / "s", pack_size=512, on_overflow="split", warn=False)
    again = pack_sft(tmp_path / "sft", tmp_path / "s2", pack_size=512, on_overflow="split", warn=False)
    assert cut["truncated"] > 0 and split["truncation"]["split_examples"] == cut["truncated"]
    assert split["truncation"]["tokens_lost"] < cut["truncation"]["tokens_lost"]
    assert split["truncation"]["trained_targets_lost"] < cut["truncation"]["trained_targets_lost"]
    ds = open_packed(tmp_path / "s")
    ds.validate()
    for name in ARRAYS:
        assert (tmp_path / "s" / f"{name}.npy").read_bytes() == (tmp_path / "s2" / f"{name}.npy").read_bytes()
    assert again["num_sequences"] == split["num_sequences"] > cut["num_sequences"]


def test_a_split_that_keeps_no_piece_packs_an_empty_shard_and_counts_the_loss(tmp_path):
    """Every conversation over the pack size and none with an answer: no piece trains anything, so none is kept;
    the shard is empty (as with truncate and nothing left) and the loss is counted, not a numpy error."""
    only_questions = [turn(USR, 40, 200) + turn(USR, 40, 300)]  # 84 tokens, no assistant turn
    cache = write_sft_cache(tmp_path / "c", only_questions)
    with pytest.warns(UserWarning, match=r"--seq-len 64 splits examples and loses 100.0% of the tokens \(84 of 84\)"):
        m = pack_sft(cache, tmp_path / "p", pack_size=64, on_overflow="split")
    assert m["num_sequences"] == 0 and m["truncation"]["split_pieces"] == 0
    assert m["truncation"]["tokens_lost"] == 84 and m["truncation"]["split_examples"] == 1
    assert len(open_packed(tmp_path / "p")) == 0
