"""Bad-input catalogue: `train` and `sample` (every flag of theirs that can be wrong, and issue 22's defects).

Each case goes through check_case (one `error: ...` line, the right exit status, inputs unchanged); on top
of that, every file the case's scratch directory held before the command (an earlier run's checkpoints
among them) is byte-for-byte unchanged after it, and no checkpoint or run record appeared.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from .conftest import write_pretrain_cache
from .test_bad_input_catalogue import Case, World, _snapshot, check_case, world  # noqa: F401

TINY = ["--depth", "1", "--n-embd", "32", "--sequence-len", "16", "--device-batch-size", "2", "--eval-steps", "1"]
_RUNS: dict[Path, Path] = {}


def _base_run(w: World) -> Path:
    """A finished 2-step run on the world's pretraining cache (made once per module), its directory."""
    if w.root not in _RUNS:
        from niels_gpt.train.train import TrainConfig, train

        out = w.root / "base-run"
        train(TrainConfig(data=str(w.pretrain), out_dir=str(out), tokenizer=str(w.tokenizer), depth=1, n_embd=32,
                          sequence_len=16, device_batch_size=2, steps=2, save_every=1, eval_steps=1),
              log=lambda *a: None)
        _RUNS[w.root] = out
    return _RUNS[w.root]


def _run_copy(w, tmp, name="run") -> Path:
    return shutil.copytree(_base_run(w), tmp / name)


def _train(w, tmp, *extra, data=None):
    return ["train", str(data or w.pretrain), "--out-dir", str(tmp / "run"), "--steps", "2", *TINY, *extra]


def _flip_weight(ckpt: Path) -> Path:
    from niels_gpt.train.checkpoint import load_checkpoint

    raw = ckpt.read_bytes()
    at = raw.find(load_checkpoint(ckpt)["model"]["transformer.wte.weight"][5].numpy().tobytes())
    ckpt.write_bytes(raw[:at + 3] + bytes([raw[at + 3] ^ 0x04]) + raw[at + 4:])
    return ckpt


# -- train: the run directory (issue 22, defect 5) -------------------------------------------------------

def out_dir_holds_another_run(w, tmp):
    _run_copy(w, tmp)
    return _train(w, tmp, "--seed", "7")


def out_dir_holds_user_files(w, tmp):
    (tmp / "run").mkdir()
    (tmp / "run" / "notes.txt").write_text("mine")
    return _train(w, tmp, "--overwrite")


def out_dir_inside_the_data(w, tmp):
    return ["train", str(w.pretrain), "--out-dir", str(w.pretrain / "ckpts"), "--steps", "1", *TINY]


def out_dir_is_the_data(w, tmp):
    return ["train", str(w.pretrain), "--out-dir", str(w.pretrain), "--steps", "1", *TINY]


def out_dir_is_a_file(w, tmp):
    (tmp / "run").write_text("mine")
    return _train(w, tmp)


def resume_another_runs_checkpoint_into_a_run(w, tmp):
    _run_copy(w, tmp)
    other = _run_copy(w, tmp, "other")
    return _train(w, tmp, "--steps", "3", "--resume", str(other / "ckpt_000001.pt"))


def resume_an_earlier_checkpoint_of_the_run(w, tmp):
    run = _run_copy(w, tmp)
    return _train(w, tmp, "--steps", "3", "--resume", str(run / "ckpt_000001.pt"))


def overwrite_later_checkpoints_not_the_runs(w, tmp):
    run = _run_copy(w, tmp)
    shutil.copy(run / "ckpt_000002.pt", run / "ckpt_000003.pt")
    return _train(w, tmp, "--steps", "3", "--resume", str(run / "ckpt_000001.pt"), "--overwrite")


# -- train: checkpoints (defect 11) -----------------------------------------------------------------------

def resume_a_changed_weight(w, tmp):
    run = _run_copy(w, tmp)
    _flip_weight(run / "ckpt_000002.pt")
    return _train(w, tmp, "--steps", "3", "--resume", "latest")


def resume_a_truncated_checkpoint(w, tmp):
    run = _run_copy(w, tmp)
    ckpt = run / "ckpt_000002.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:-4096])
    return _train(w, tmp, "--steps", "3", "--resume", str(ckpt))


def resume_a_missing_checkpoint(w, tmp):
    return _train(w, tmp, "--resume", str(tmp / "nowhere.pt"))


def resume_a_directory(w, tmp):
    _run_copy(w, tmp)
    return _train(w, tmp, "--resume", str(tmp / "run"))


def resume_latest_of_an_empty_dir(w, tmp):
    return _train(w, tmp, "--resume", "latest")


def init_from_a_changed_weight(w, tmp):
    other = _run_copy(w, tmp, "base")
    return _train(w, tmp, "--init-from", str(_flip_weight(other / "ckpt_000002.pt")))


def init_from_and_resume(w, tmp):
    return _train(w, tmp, "--init-from", str(_base_run(w) / "ckpt_000002.pt"), "--resume", "latest")


def init_from_with_another_depth(w, tmp):
    return _train(w, tmp, "--init-from", str(_base_run(w) / "ckpt_000002.pt"), "--depth", "3")


def init_from_another_vocabulary(w, tmp):
    data = write_pretrain_cache(tmp / "small", {"train": [np.arange(600) % 90 + 5]}, vocab_size=100)
    return _train(w, tmp, "--init-from", str(_base_run(w) / "ckpt_000002.pt"), data=data)


def loss_turns_nan(w, tmp):
    from niels_gpt.train.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(_base_run(w) / "ckpt_000002.pt")
    ckpt.pop("verified")
    ckpt["model"]["transformer.h.0.attn.c_q.weight"][1, 1] = float("inf")  # a model gone bad, saved as such
    save_checkpoint(tmp / "poisoned" / "ckpt_000002.pt", ckpt)
    _run_copy(w, tmp)
    return _train(w, tmp, "--init-from", str(tmp / "poisoned" / "ckpt_000002.pt"), "--overwrite")


# -- train: data and flags (defect 13) --------------------------------------------------------------------

def train_on_a_jsonl_file(w, tmp):
    (tmp / "docs.jsonl").write_text('{"text": "a document"}\n')
    return _train(w, tmp, data=tmp / "docs.jsonl")


def train_on_an_unfinished_cache(w, tmp):
    cache = shutil.copytree(w.pretrain, tmp / "cache")
    (cache / "meta.json").unlink()
    return _train(w, tmp, data=cache)


def train_on_a_cache_still_being_built(w, tmp):
    (tmp / "cache.tmp-999999" / "train").mkdir(parents=True)
    return _train(w, tmp, data=tmp / "cache")


def device_cuda_on_a_cpu_only_torch(w, tmp):
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    return _train(w, tmp, "--device", "cuda")


def device_unknown(w, tmp):
    return _train(w, tmp, "--device", "tpu")


def attention_flex_on_cpu(w, tmp):
    if torch.cuda.is_available():
        pytest.skip("auto would pick the GPU")
    return _train(w, tmp, "--attention", "flex", "--device", "cpu")


def attention_unknown(w, tmp):
    return _train(w, tmp, "--attention", "dense")


def peak_tflops_zero(w, tmp):
    return _train(w, tmp, "--peak-tflops", "0")


def prefetch_negative(w, tmp):
    return _train(w, tmp, "--prefetch", "-1")


def sequence_len_zero(w, tmp):
    return _train(w, tmp, "--sequence-len", "0")


def steps_zero(w, tmp):
    return _train(w, tmp, "--steps", "0")


def total_batch_not_a_multiple(w, tmp):
    return _train(w, tmp, "--total-batch-size", "100")


# -- sample -----------------------------------------------------------------------------------------------

def _sample(w, *extra, ckpt=None):
    return ["sample", str(ckpt or _base_run(w) / "ckpt_000002.pt"), "--prompt", "Once", "--max-tokens", "3", *extra]


def sample_a_missing_checkpoint(w, tmp):
    return _sample(w, ckpt=tmp / "nowhere.pt")


def sample_a_changed_weight(w, tmp):
    return _sample(w, ckpt=_flip_weight(_run_copy(w, tmp) / "ckpt_000002.pt"))


def sample_not_a_checkpoint(w, tmp):
    (tmp / "x.pt").write_bytes(b"PK\x03\x04 not really a zip")
    return _sample(w, ckpt=tmp / "x.pt")


def sample_zero_tokens(w, tmp):
    return _sample(w, "--max-tokens", "0")


def sample_negative_temperature(w, tmp):
    return _sample(w, "--temperature", "-1")


def sample_negative_top_k(w, tmp):
    return _sample(w, "--top-k", "-2")


def sample_negative_seed(w, tmp):
    return _sample(w, "--seed", "-1")


def sample_without_a_prompt(w, tmp):
    return ["sample", str(_base_run(w) / "ckpt_000002.pt")]


def sample_with_a_larger_tokenizer(w, tmp):
    from niels_gpt.train.train import TrainConfig, train

    data = write_pretrain_cache(tmp / "small", {"train": [np.arange(600) % 90 + 5], "val": [np.arange(90) + 5]},
                                vocab_size=100)
    r = train(TrainConfig(data=str(data), out_dir=str(tmp / "small-run"), depth=1, n_embd=32, sequence_len=16,
                          device_batch_size=2, steps=1), token_bytes=torch.ones(100, dtype=torch.int64),
              log=lambda *a: None)
    return _sample(w, "--tokenizer", str(w.tokenizer), ckpt=r.checkpoint)


def sample_whose_tokenizer_is_gone(w, tmp):
    from niels_gpt.train.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(_base_run(w) / "ckpt_000002.pt")
    ckpt.pop("verified")
    ckpt["tokenizer"] = str(tmp / "moved" / "spm.model")
    ckpt["train_config"]["data"] = str(tmp / "moved-cache")
    save_checkpoint(tmp / "r" / "ckpt_000002.pt", ckpt)
    return _sample(w, ckpt=tmp / "r" / "ckpt_000002.pt")


def sample_device_cuda_on_a_cpu_only_torch(w, tmp):
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    return _sample(w, "--device", "cuda")


CASES = [
    Case("train: --out-dir holds another run", out_dir_holds_another_run,
         ("--out-dir", "holds a run on", "seed 42", "checkpoints at steps 1, 2", "--resume latest", "--overwrite")),
    Case("train: --out-dir holds a user's files", out_dir_holds_user_files,
         ("holds files this trainer did not write", "notes.txt")),
    Case("train: --out-dir inside the data", out_dir_inside_the_data, ("--out-dir", "inside the data directory"),
         reads=("pretrain",)),
    Case("train: --out-dir is the data", out_dir_is_the_data, ("--out-dir", "is the data", "itself"),
         reads=("pretrain",)),
    Case("train: --out-dir is a file", out_dir_is_a_file, ("--out-dir", "a file, not a directory")),
    Case("train: --resume of another run into a run", resume_another_runs_checkpoint_into_a_run,
         ("another run's checkpoint", "mix two runs")),
    Case("train: --resume a checkpoint before the run's newest", resume_an_earlier_checkpoint_of_the_run,
         ("--resume", "ckpt_000001.pt", "later checkpoints (ckpt_000002.pt)", "--overwrite", "new --out-dir")),
    Case("train: --resume --overwrite with later checkpoints run.json does not record",
         overwrite_later_checkpoints_not_the_runs, ("--overwrite", "ckpt_000003.pt", "does not record", "move them out")),
    Case("train: --resume a checkpoint with a changed weight", resume_a_changed_weight,
         ("ckpt_000002.pt", "checksum mismatch", "ckpt_000001.pt")),
    Case("train: --resume a truncated checkpoint", resume_a_truncated_checkpoint,
         ("ckpt_000002.pt", "not a readable checkpoint")),
    Case("train: --resume a missing file", resume_a_missing_checkpoint, ("--resume", "nowhere.pt", "no such file")),
    Case("train: --resume a directory", resume_a_directory, ("--resume", "a directory", "ckpt_<step>.pt")),
    Case("train: --resume latest with no checkpoint", resume_latest_of_an_empty_dir,
         ("--resume latest", "no ckpt_", "start without --resume")),
    Case("train: --init-from a checkpoint with a changed weight", init_from_a_changed_weight,
         ("--init-from", "checksum mismatch")),
    Case("train: --init-from and --resume", init_from_and_resume, ("--resume and --init-from both given", "pick one")),
    Case("train: --init-from with another --depth", init_from_with_another_depth,
         ("--depth 3", "n_layer = 1", "drop the flag")),
    Case("train: --init-from onto another vocabulary", init_from_another_vocabulary,
         ("--init-from", "2004 embedding rows", "vocabulary of 100")),
    Case("train: the loss turns non-finite", loss_turns_nan,
         ("step 1", "the loss is", "stopped before saving anything", "learning rates")),
    Case("train: a .jsonl file as DATA", train_on_a_jsonl_file, ("docs.jsonl", "a text file", "not a token cache",
                                                                  "build one from it first")),
    Case("train: an unfinished cache", train_on_an_unfinished_cache,
         ("cache", "unfinished build", "no meta.json", "build it again")),
    Case("train: a cache whose build is still staged", train_on_a_cache_still_being_built,
         ("its build was interrupted", "cache.tmp-999999", "running the command that writes it")),
    Case("train: --device cuda on a CPU-only torch", device_cuda_on_a_cpu_only_torch,
         ("--device cuda", "cpu-only build", "--device cpu")),
    Case("train: --device tpu", device_unknown, ("--device 'tpu'", "expected auto, cpu, cuda")),
    Case("train: --attention flex on CPU", attention_flex_on_cpu, ("--attention flex", "--attention mask")),
    Case("train: --attention dense", attention_unknown, ("--attention", "invalid choice"), status=2),
    Case("train: --peak-tflops 0", peak_tflops_zero, ("--peak-tflops 0", "must be > 0")),
    Case("train: --prefetch -1", prefetch_negative, ("--prefetch -1", ">= 0")),
    Case("train: --sequence-len 0", sequence_len_zero, ("--seq-len 0", ">= 1")),
    Case("train: --steps 0", steps_zero, ("steps 0", ">= 1")),
    Case("train: --total-batch-size not a multiple", total_batch_not_a_multiple,
         ("total_batch_size 100", "not a multiple")),
    Case("sample: a missing checkpoint", sample_a_missing_checkpoint, ("sample", "nowhere.pt", "no such file")),
    Case("sample: a checkpoint with a changed weight", sample_a_changed_weight, ("sample", "checksum mismatch")),
    Case("sample: not a checkpoint", sample_not_a_checkpoint, ("x.pt", "not a readable checkpoint")),
    Case("sample: --max-tokens 0", sample_zero_tokens, ("--max-tokens 0", ">= 1")),
    Case("sample: --temperature -1", sample_negative_temperature, ("--temperature -1", ">= 0")),
    Case("sample: --top-k -2", sample_negative_top_k, ("--top-k -2", ">= 0")),
    Case("sample: --seed -1", sample_negative_seed, ("--seed -1", "2**63 - 1")),
    Case("sample: no --prompt", sample_without_a_prompt, ("--prompt", "required"), status=2),
    Case("sample: a tokenizer larger than the model", sample_with_a_larger_tokenizer,
         ("--tokenizer", "2004 ids", "100 embedding rows")),
    Case("sample: the run's tokenizer is gone", sample_whose_tokenizer_is_gone, ("moved", "pass --tokenizer")),
    Case("sample: --device cuda on a CPU-only torch", sample_device_cuda_on_a_cpu_only_torch,
         ("--device cuda", "cpu-only build")),
]


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
