"""Bad-input catalogue: `train` and `sample`, third part (vocabulary, split paths and URLs, resumes on other
data, sampling temperatures, the advice of --init-from refusals, tokenizers that are not the recorded one).

Each case goes through check_case (one `error: ...` line, the right exit status, inputs unchanged); on top of
that, every file the case's scratch directory held before the command is byte-for-byte unchanged after it, and
no checkpoint or run record appeared.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from .conftest import write_pretrain_cache
from .test_bad_input_catalogue import Case, _snapshot, check_case, world  # noqa: F401
from .test_bad_input_catalogue_train import _base_run, _run_copy, _sample, _train

BASE_FLAGS = ["--depth", "1", "--n-embd", "32", "--sequence-len", "16", "--device-batch-size", "2", "--eval-steps",
              "1", "--save-every", "1"]  # the base run's (test_bad_input_catalogue_train._base_run)


def _rewrite_meta(cache: Path, **changes) -> None:
    """meta.json with `changes`, written as a build writes it (its record_sha256 renewed)."""
    import json

    from niels_gpt.meta import write_meta

    write_meta(str(cache), {**json.loads((cache / "meta.json").read_text()), **changes})


def _packed_without_its_cache(w, tmp, **meta) -> Path:
    """Packed bins of a copy of the world's SFT cache, that copy deleted since (its meta.json edited first)."""
    from niels_gpt.packing import pack_sft

    sft = shutil.copytree(w.sft, tmp / "sft")
    if meta:
        _rewrite_meta(sft, **meta)
    pack_sft(sft, tmp / "bins", pack_size=32, algorithm="ffd", on_overflow="truncate", warn=False)
    shutil.rmtree(sft)
    return tmp / "bins"


# -- train: the vocabulary -----------------------------------------------------------------------------------

def vocab_size_below_the_caches(w, tmp):
    return _train(w, tmp, "--vocab-size", "100")


def vocab_size_below_packed_bins_ids(w, tmp):
    bins = _packed_without_its_cache(w, tmp)
    return ["train", str(bins), "--out-dir", str(tmp / "run"), "--steps", "1", "--depth", "1", "--n-embd", "32",
            "--sequence-len", "32", "--device-batch-size", "2", "--vocab-size", "50"]


def init_from_onto_packed_bins_of_another_tokenizer(w, tmp):
    from niels_gpt.tokenizer import load_tokenizer

    bins = _packed_without_its_cache(w, tmp, tokenizer_sha256="cd" * 32)
    return ["train", str(bins), "--out-dir", str(tmp / "run"), "--steps", "1", "--sequence-len", "32",
            "--device-batch-size", "2", "--init-from", str(_base_run(w) / "ckpt_000002.pt"),
            "--vocab-size", str(len(load_tokenizer(w.tokenizer)))]


# -- train: a split instead of its cache ---------------------------------------------------------------------

def train_on_a_splits_path(w, tmp):
    return _train(w, tmp, data=w.pretrain / "train")


def train_on_a_splits_url(w, tmp):
    from niels_gpt.storage.upload import upload_tree

    url = f"memory://catalogue-train3-{tmp.name}/docs"
    upload_tree(w.pretrain, url)
    return _train(w, tmp, "--local-cache", str(tmp / "downloads"), data=f"{url}/train")


# -- train: resume on other data -----------------------------------------------------------------------------

def resume_on_the_compressed_copy(w, tmp):
    pytest.importorskip("zstandard")
    from niels_gpt.formats.convert import convert

    _run_copy(w, tmp)
    copy = tmp / "zst" / w.pretrain.name  # the same name: only the compression differs
    convert(w.pretrain, copy, to="niels", compress="zstd", shard_bytes=8192)
    return ["train", str(copy), "--out-dir", str(tmp / "run"), "--tokenizer", str(w.tokenizer), "--steps", "3",
            *BASE_FLAGS, "--resume", "latest"]


def resume_on_other_tokens(w, tmp):
    _run_copy(w, tmp)
    import json

    meta = json.loads((w.pretrain / "meta.json").read_text())
    other = write_pretrain_cache(tmp / "other" / w.pretrain.name, {"train": [np.arange(3000) % 90 + 5],
                                                                   "val": [np.arange(300) % 90 + 5]},
                                 vocab_size=meta["vocab_size"])
    _rewrite_meta(other, tokenizer_sha256=meta["tokenizer_sha256"])  # the same tokenizer, other tokens
    return ["train", str(other), "--out-dir", str(tmp / "run"), "--steps", "3", *BASE_FLAGS, "--resume", "latest"]


def resume_in_another_order(w, tmp):
    from .train.test_new_order import other_order, rewrite_loader_state

    rewrite_loader_state(_run_copy(w, tmp) / "ckpt_000002.pt", other_order)
    return ["train", str(w.pretrain), "--out-dir", str(tmp / "run"), "--tokenizer", str(w.tokenizer), "--steps", "3",
            *BASE_FLAGS, "--resume", "latest"]


def batch_ramp_without_samples(w, tmp):
    return _train(w, tmp, "--batch-ramp", "4:16")


# -- train: --init-from refusals say where to go -------------------------------------------------------------

def init_from_a_missing_file(w, tmp):
    (tmp / "runs").mkdir()
    return _train(w, tmp, "--init-from", str(tmp / "runs" / "ckpt_000009.pt"))


def init_from_a_truncated_checkpoint_beside_others(w, tmp):
    run = _run_copy(w, tmp, "base")
    ckpt = run / "ckpt_000002.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:-4096])
    return _train(w, tmp, "--init-from", str(ckpt))


# -- sample --------------------------------------------------------------------------------------------------

def sample_temperature_nan(w, tmp):
    return _sample(w, "--temperature", "nan")


def sample_temperature_inf(w, tmp):
    return _sample(w, "--temperature", "inf")


def sample_with_another_tokenizer_of_the_same_size(w, tmp):
    from niels_gpt.tokenizer import load_tokenizer

    assert len(load_tokenizer(w.other_tokenizer)) == len(load_tokenizer(w.tokenizer))  # the same number of ids
    return _sample(w, "--tokenizer", str(w.other_tokenizer))


def keep_last_zero(w, tmp):
    return _train(w, tmp, "--keep-last", "0")


def keep_last_negative(w, tmp):
    return _train(w, tmp, "--keep-last", "-1")


def eval_steps_negative(w, tmp):
    return _train(w, tmp, "--eval-steps", "-1")


def sample_system_prompt_without_chat(w, tmp):
    return _sample(w, "--system", "Be brief.")


def resume_past_the_steps(w, tmp):
    _run_copy(w, tmp)  # at step 2
    return ["train", str(w.pretrain), "--out-dir", str(tmp / "run"), "--tokenizer", str(w.tokenizer), "--steps", "1",
            *BASE_FLAGS, "--resume", "latest"]


def stop_at_zero(w, tmp):
    return _train(w, tmp, "--stop-at", "0")


def core_bundle_missing(w, tmp):
    return _train(w, tmp, "--core", str(tmp / "no-bundle"))


def core_without_a_tokenizer(w, tmp):
    cache = write_pretrain_cache(tmp / "hand", {"train": [np.arange(3000) % 90 + 5], "val": [np.arange(300) % 90 + 5]})
    return _train(w, tmp, "--core", "bundled", data=cache)  # records no tokenizer, and none is above it


def core_max_items_negative(w, tmp):
    return _train(w, tmp, "--core", "bundled", "--core-max-items", "-1")


def save_every_negative(w, tmp):
    return _train(w, tmp, "--save-every", "-1")  # saved every step


def workers_negative(w, tmp):
    return _train(w, tmp, "--workers", "-1")


def total_batch_size_negative(w, tmp):
    return _train(w, tmp, "--total-batch-size", "-32")  # -1 micro-batches: a nan loss, "lower the learning rates"


def val_split_shorter_than_a_row(w, tmp):
    import json

    meta = json.loads((w.pretrain / "meta.json").read_text())
    short = write_pretrain_cache(tmp / "short-val", {"train": [np.arange(3000) % 90 + 5], "val": [np.arange(12) % 90 + 5]},
                                 vocab_size=meta["vocab_size"])
    _rewrite_meta(short, tokenizer_sha256=meta["tokenizer_sha256"])
    return _train(w, tmp, "--tokenizer", str(w.tokenizer), data=short)  # val bpb ran after the last step, saved


def mixture_with_another_tokenizer(w, tmp):
    import json

    (tmp / "mix.json").write_text(json.dumps({"datasets": {"web": str(w.pretrain)}, "weights": {"web": 1}}))
    return _train(w, tmp, "--tokenizer", str(w.other_tokenizer), data=tmp / "mix.json")  # bpb by its byte lengths


def packed_bins_with_another_tokenizer(w, tmp):
    from niels_gpt.packing import pack_sft

    pack_sft(w.sft, tmp / "bins", pack_size=32, algorithm="ffd", on_overflow="truncate", warn=False)
    return ["train", str(tmp / "bins"), "--out-dir", str(tmp / "run"), "--steps", "1", "--depth", "1", "--n-embd",
            "32", "--sequence-len", "32", "--device-batch-size", "2", "--tokenizer", str(w.other_tokenizer)]


def n_embd_zero(w, tmp):
    return _train(w, tmp, "--n-embd", "0")  # the default width, silently


def n_head_zero(w, tmp):
    return _train(w, tmp, "--n-head", "0")  # the default heads, silently


def final_lr_frac_negative(w, tmp):
    return _train(w, tmp, "--final-lr-frac", "-0.5")  # the last steps' rate below zero: gradient ascent


def warmup_and_warmdown_over_all_steps(w, tmp):
    return _train(w, tmp, "--warmup-ratio", "0.7", "--warmdown-ratio", "0.5")


def malloc_setting_misspelt(w, tmp):
    os.environ["NIELS_GPT_MALLOC"] = "sytem"  # restored by _environment_back
    return _train(w, tmp)


CASES = [
    Case("train: --vocab-size below the cache's", vocab_size_below_the_caches,
         ("--vocab-size 100", "below the", "ids", "pass --vocab-size")),
    Case("train: --vocab-size below the ids of packed bins whose cache is gone", vocab_size_below_packed_bins_ids,
         ("bins", "token id", "50 embedding rows", "pass --vocab-size above")),
    Case("train: --init-from onto packed bins of another tokenizer", init_from_onto_packed_bins_of_another_tokenizer,
         ("--init-from", "another tokenizer", "cdcdcdcdcdcd", "bins was built with", "base run's tokenizer")),
    Case("train: a split's path", train_on_a_splits_path, ("docs/train", "the train split of the cache",
                                                            "train on the cache directory"), reads=("pretrain",)),
    Case("train: a split's URL", train_on_a_splits_url, ("docs/train", "the train split of the cache",
                                                         "train on the cache's URL", "/docs)")),
    Case("train: --resume on the compressed copy of the run's cache", resume_on_the_compressed_copy,
         ("--resume", "other data", "same shards and token counts", "uncompressed there and zstd here",
          "--init-from")),
    Case("train: --resume on other tokens", resume_on_other_tokens,
         ("--resume", "other data", "other shards or token counts", "resume on the data the run trained on")),
    Case("train: --resume whose data order changed", resume_in_another_order,
         ("--resume", "ckpt_000002.pt", "the next 8 samples", "digest", "pass --allow-new-order")),
    Case("train: --batch-ramp without its samples", batch_ramp_without_samples,
         ("--batch-ramp 4:16", "expected START:END:SAMPLES", "e.g. --batch-ramp 8:32:2000")),
    Case("train: --init-from a missing file", init_from_a_missing_file,
         ("--init-from", "no such file", "without --init-from")),
    Case("train: --init-from a truncated checkpoint beside others", init_from_a_truncated_checkpoint_beside_others,
         ("--init-from", "not a readable checkpoint", "e.g. --init-from", "ckpt_000001.pt")),
    Case("sample: --temperature nan", sample_temperature_nan, ("--temperature nan", "a number >= 0")),
    Case("sample: --temperature inf", sample_temperature_inf, ("--temperature inf", "a number >= 0")),
    Case("sample: another tokenizer of the same size", sample_with_another_tokenizer_of_the_same_size,
         ("--tokenizer", "not the tokenizer its model was trained with", "pass the tokenizer the run was trained")),
    Case("train: --keep-last 0", keep_last_zero, ("--keep-last 0", "must be >= 1", "keep every checkpoint")),
    Case("train: --keep-last -1", keep_last_negative, ("--keep-last -1", "must be >= 1", "keep every checkpoint")),
    Case("train: --eval-steps -1", eval_steps_negative, ("--eval-steps -1", "must be >= 0", "0 skips val bpb")),
    Case("sample: --system without --chat", sample_system_prompt_without_chat,
         ("--system", "opens a conversation", "sample with --chat")),
    Case("train: --resume of a run past --steps", resume_past_the_steps,
         ("--resume", "ckpt_000002.pt", "at step 2, past --steps 1", "nothing to train", "give --steps above 2")),
    Case("train: --stop-at 0", stop_at_zero, ("--stop-at 0", "must be >= 1")),
    Case("train: --core of a directory without a bundle", core_bundle_missing,
         ("--core", "no-bundle", "no core.yaml", "or 'bundled'")),
    Case("train: --core without a tokenizer", core_without_a_tokenizer,
         ("--core needs the tokenizer", "none was found", "pass --tokenizer")),
    Case("train: --core-max-items -1", core_max_items_negative, ("--core-max-items -1", "must be >= 1")),
    Case("train: --save-every -1", save_every_negative, ("--save-every -1", "must be >= 0", "only the last step")),
    Case("train: --workers -1", workers_negative, ("--workers -1", "must be >= 0", "0: load in the training process")),
    Case("train: --total-batch-size -32", total_batch_size_negative, ("--total-batch-size -32", "must be >= 1")),
    Case("train: a val split shorter than one row", val_split_shorter_than_a_row,
         ("short-val/val", "largest has 12 tokens", "--eval-steps 0")),
    Case("train: a mixture with another --tokenizer", mixture_with_another_tokenizer,
         ("sha256", "docs", "was built with the tokenizer", "pass the tokenizer that built it")),
    Case("train: packed bins with another --tokenizer", packed_bins_with_another_tokenizer,
         ("sha256", "bins", "was built with the tokenizer", "pass the tokenizer that built it")),
    Case("train: --n-embd 0", n_embd_zero, ("--n-embd 0", "must be >= 1")),
    Case("train: --n-head 0", n_head_zero, ("--n-head 0", "must be >= 1")),
    Case("train: --final-lr-frac below 0", final_lr_frac_negative, ("--final-lr-frac -0.5", "must be in [0, 1]")),
    Case("train: --warmup-ratio and --warmdown-ratio over all the steps", warmup_and_warmdown_over_all_steps,
         ("--warmup-ratio 0.7", "--warmdown-ratio 0.5", "sum must be at most 1")),
    Case("train: NIELS_GPT_MALLOC of no known value", malloc_setting_misspelt,
         ("NIELS_GPT_MALLOC='sytem'", "expected 'system'", "'keep'", "unset it")),
]


@pytest.fixture(autouse=True)
def _environment_back():
    had = os.environ.get("NIELS_GPT_MALLOC")
    yield
    if had is None:
        os.environ.pop("NIELS_GPT_MALLOC", None)
    else:
        os.environ["NIELS_GPT_MALLOC"] = had


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_train_and_sample_bad_input_gets_one_line_and_loses_nothing(case, world, tmp_path, capsys):  # noqa: F811
    before: dict = {}

    def make(w, tmp):
        argv = case.make(w, tmp)
        before.update(_snapshot(tmp))
        return argv

    check_case(Case(case.name, make, case.expect, case.status, case.out, case.needs, case.reads, case.report),
               world, tmp_path, capsys)
    after = _snapshot(tmp_path)
    assert {k: after.get(k) for k in before} == before, "a file that was there changed"
    new = [k for k in set(after) - set(before) if Path(k).name.startswith("ckpt_") or Path(k).name == "run.json"]
    assert not new, f"written: {new}"
