"""The builders' draws (niels_gpt/seeds.py's TorchDraws) are torch's own: the split rules, the shuffle buffer,
the file split and pack-sft's shuffled order name torch's calls on a torch.Generator, and they are computed without
importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from niels_gpt import seeds
from niels_gpt.errors import ConfigError
from niels_gpt.seeds import SEED_MAX, TorchDraws

from .conftest import REPO


@pytest.mark.parametrize("seed", [0, 1, 42, 7, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 123456789, SEED_MAX])
def test_the_draws_are_torchs_block_after_block(seed):
    ours, gen = TorchDraws(seed), torch.Generator().manual_seed(seed)
    for n in (1024, 1, 17, 1024, 4096):  # blocks of any size continue one stream, as torch's calls do
        assert ours.uniform(n) == torch.rand(n, generator=gen, dtype=torch.float64).tolist()


HIGHS = [1, 2, 3, 1000, 2**16 + 1, 2**28 - 1, 2**28, 2**28 + 3, 2**31 + 1, 2**32 - 1, 2**32, 2**40 + 7, 2**62 + 9]


@pytest.mark.parametrize("seed", [0, 42, 2**40 + 3])
def test_integers_and_permutations_are_torchs_in_one_stream(seed):
    """randint below 2**28 takes one output a draw, from 2**28 two (both sides of the edge checked); randperm is
    a Fisher-Yates pass; calls of every kind continue one stream, as the shuffle buffer makes them."""
    ours, gen = TorchDraws(seed), torch.Generator().manual_seed(seed)
    for high in HIGHS:
        assert ours.below(high, 700) == torch.randint(high, (700,), generator=gen).tolist(), high
        n = high % 5000
        assert ours.permutation(n) == torch.randperm(n, generator=gen).tolist(), n
        assert ours.uniform(3) == torch.rand(3, generator=gen, dtype=torch.float64).tolist()
    assert ours.permutation(100_003) == torch.randperm(100_003, generator=gen).tolist()


def test_a_long_permutation_is_torchs_own_call_after_the_draws_made():
    """From TORCH_PERMUTATION elements torch.randperm itself runs, on a generator advanced past the outputs
    already drawn: the same stream as torch's own calls."""
    ours, gen = TorchDraws(9), torch.Generator().manual_seed(9)
    assert ours.below(2**30, 5) == torch.randint(2**30, (5,), generator=gen).tolist()  # 10 outputs
    assert ours.below(77, 4) == torch.randint(77, (4,), generator=gen).tolist()
    assert ours.words == 14
    n = seeds.TORCH_PERMUTATION + 5
    assert ours.permutation(n) == torch.randperm(n, generator=gen).tolist()
    assert ours.below(1000, 3) == torch.randint(1000, (3,), generator=gen).tolist()  # the stream goes on after it
    ours._words((1 << 24) + 3)  # past one advancing call of torch's: the catch-up goes in pieces
    torch.randint(2, ((1 << 24) + 3,), generator=gen)
    assert ours.permutation(n) == torch.randperm(n, generator=gen).tolist()


def _torch_shuffled(items, size: int, gen):
    """The shuffle buffer as it drew with torch: torch.randint(size, (4096,)) calls, then torch.randperm."""
    buf, draws = [], []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        draws = draws or torch.randint(size, (4096,), generator=gen).tolist()[::-1]
        j = draws.pop()
        yield buf[j]
        buf[j] = item
    yield from (buf[j] for j in torch.randperm(len(buf), generator=gen).tolist())


@pytest.mark.parametrize("size, n", [(2, 9), (1000, 10_007), (4096, 3_000), (50_000, 120_001)])
def test_the_shuffle_buffer_gives_the_order_torch_gave(size, n):
    from niels_gpt.builders.encoding import shuffled

    ours = list(shuffled(range(n), size, TorchDraws(5)))
    assert ours == list(_torch_shuffled(range(n), size, torch.Generator().manual_seed(5)))
    assert sorted(ours) == list(range(n))


def test_a_seed_outside_torchs_range_is_refused():
    """A seed one above SEED_MAX (a split's own generator, seed + 1) is torch's too; past 2**64 is refused."""
    assert TorchDraws(SEED_MAX + 1).uniform(5) == torch.rand(5, generator=torch.Generator().manual_seed(SEED_MAX + 1),
                                                            dtype=torch.float64).tolist()
    for bad in (-1, 2**64, True):
        with pytest.raises(ConfigError, match="must be an integer from 0 to 2\\*\\*63 - 1"):
            TorchDraws(bad)


def test_a_build_with_a_val_split_does_not_import_torch(tokenizer, tmp_path):
    """`build --val-frac` (pretraining and --chat) and `--shuffle-buffer` draw with numpy: no torch in the process."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} of the corpus"}) + "\n" for i in range(40)),
                    encoding="utf-8")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": f"yo {i}"}]}) + "\n"
                             for i in range(40)), encoding="utf-8")
    script = ("import sys; from niels_gpt.cli import main; rc = main(sys.argv[1:]); "
              "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    for src, extra in ((docs, ["--val-frac", "0.2"]), (chats, ["--chat", "--val-frac", "0.2"]),
                       (docs, ["--val-frac", "0.2", "--shuffle-buffer", "16"])):
        out = tmp_path / f"{src.stem}{len(extra)}"
        run = subprocess.run([sys.executable, "-c", script, "build", str(src), "--out", str(out), "--tokenizer",
                              tokenizer.model_path, "--no-progress", *extra], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        totals = json.loads((out / "meta.json").read_text())["totals"]
        assert totals["val_tokens"] > 0 and totals["train_tokens"] > totals["val_tokens"]
