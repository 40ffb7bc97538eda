"""The builders' split draws (niels_gpt/seeds.py's UniformDraws) are torch's own: the split rules in meta.json
name torch.rand on a torch.Generator, and the builder computes those values without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from niels_gpt.errors import ConfigError
from niels_gpt.seeds import SEED_MAX, UniformDraws

from .conftest import REPO


@pytest.mark.parametrize("seed", [0, 1, 42, 7, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 2**40 + 3, 123456789, SEED_MAX])
def test_the_draws_are_torchs_block_after_block(seed):
    ours, gen = UniformDraws(seed), torch.Generator().manual_seed(seed)
    for n in (1024, 1, 17, 1024, 4096):  # blocks of any size continue one stream, as torch's calls do
        assert ours.block(n) == torch.rand(n, generator=gen, dtype=torch.float64).tolist()


def test_a_seed_outside_torchs_range_is_refused():
    for bad in (-1, SEED_MAX + 1):
        with pytest.raises(ConfigError, match="must be an integer from 0 to 2\\*\\*63 - 1"):
            UniformDraws(bad)


def test_a_build_with_a_val_split_does_not_import_torch(tokenizer, tmp_path):
    """`build --val-frac` (pretraining and --chat) draws its split with numpy: no torch in the process."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} of the corpus"}) + "\n" for i in range(40)),
                    encoding="utf-8")
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": f"yo {i}"}]}) + "\n"
                             for i in range(40)), encoding="utf-8")
    script = ("import sys; from niels_gpt.cli import main; rc = main(sys.argv[1:]); "
              "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    for src, extra in ((docs, ["--val-frac", "0.2"]), (chats, ["--chat", "--val-frac", "0.2"])):
        out = tmp_path / src.stem
        run = subprocess.run([sys.executable, "-c", script, "build", str(src), "--out", str(out), "--tokenizer",
                              tokenizer.model_path, "--no-progress", *extra], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        totals = json.loads((out / "meta.json").read_text())["totals"]
        assert totals["val_tokens"] > 0 and totals["train_tokens"] > totals["val_tokens"]
