"""A run directory holds one run; checkpoints prove their payload; a diverged run saves nothing.

Issue 22: `train --out-dir D` over another run overwrote its ckpt_000002.pt with a different model; a
checkpoint with 4 KiB overwritten inside a weight resumed, trained on NaN and saved over the good ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from niels_gpt.errors import ConfigError, StateError
from niels_gpt.output_guard import OutputRefused
from niels_gpt.trace import trace_step
from niels_gpt.train.checkpoint import (
    checkpoints,
    latest_checkpoint,
    load_checkpoint,
    payload_digest,
    read_run,
    save_checkpoint,
)
from niels_gpt.train.train import DivergedError, TrainConfig, train

from .conftest import TINY, VOCAB

TOKEN_BYTES = torch.ones(VOCAB, dtype=torch.int64)


def run(data, out, **kw):
    cfg = TrainConfig(data=str(data), out_dir=str(out), **{**TINY, "steps": 2, "save_every": 1, **kw})
    return train(cfg, token_bytes=TOKEN_BYTES, log=lambda *a: None)


def snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_another_runs_directory_is_refused_and_named_unless_resumed_or_overwritten(tmp_path, pretrain_cache):
    out = tmp_path / "run"
    run(pretrain_cache, out)
    before = snapshot(out)
    with pytest.raises(OutputRefused, match=r"holds a run on .*web \(1 layers x 32, seed 42, 2 steps\), checkpoints "
                                            r"at steps 1, 2; continue that run with --resume latest, replace it "
                                            r"with --overwrite"):
        run(pretrain_cache, out, seed=1)
    assert snapshot(out) == before  # ckpt_000002.pt of the old run is still the old run's
    other = tmp_path / "other"
    run(pretrain_cache, other, steps=1)
    with pytest.raises(OutputRefused, match="another run's checkpoint: resuming it here would mix two runs"):
        run(pretrain_cache, out, resume=str(other / "ckpt_000001.pt"))
    resumed = run(pretrain_cache, out, steps=3, resume="latest")  # the same run goes on
    assert resumed.step == 3 and sorted(read_run(out)["checkpoints"]) == [f"ckpt_00000{i}.pt" for i in (1, 2, 3)]
    replaced = run(pretrain_cache, out, seed=1, steps=1, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["ckpt_000001.pt", "run.json"]
    assert read_run(out)["seed"] == 1 and replaced.checkpoint.endswith("ckpt_000001.pt")


def test_a_resume_from_an_earlier_checkpoint_keeps_one_history_in_the_run_directory(tmp_path, pretrain_cache):
    """Resumed from ckpt 2 of 2, 4, 6, a run saved 3 beside the old 4 and 6: --resume latest went on from the old
    6 and trace replayed step 4 from the new 3. Refused unless --overwrite, which removes 4 and 6 at the first save."""
    out = tmp_path / "run"
    run(pretrain_cache, out, steps=6, save_every=2)
    before = snapshot(out)
    with pytest.raises(OutputRefused, match=r"--resume .*ckpt_000002.pt: .*run holds the run's later checkpoints "
                                            r"\(ckpt_000004.pt, ckpt_000006.pt\); .* --resume latest and trace would "
                                            r"mix the two: pass --overwrite .*, or resume into a new --out-dir"):
        run(pretrain_cache, out, steps=6, stop_at=3, resume=str(out / "ckpt_000002.pt"))
    assert snapshot(out) == before
    branch = run(pretrain_cache, tmp_path / "branch", steps=6, stop_at=3, resume=str(out / "ckpt_000002.pt"))
    assert branch.step == 3 and snapshot(out) == before  # the old history stays whole beside the new one
    (out / "ckpt_000005.pt").write_bytes(before["ckpt_000004.pt"])  # a copy of the user's: not the run's to remove
    with pytest.raises(OutputRefused, match=r"--overwrite: .* holds later checkpoints its run.json does not record "
                                            r"as the run's \(ckpt_000005.pt\): .* move them out"):
        run(pretrain_cache, out, steps=6, stop_at=3, resume=str(out / "ckpt_000002.pt"), overwrite=True)
    (out / "ckpt_000005.pt").unlink()
    assert snapshot(out) == before
    lines: list[str] = []
    cfg = TrainConfig(data=str(pretrain_cache), out_dir=str(out), **{**TINY, "steps": 6, "save_every": 2,
                                                                     "stop_at": 3, "overwrite": True,
                                                                     "resume": str(out / "ckpt_000002.pt")})
    rewound = train(cfg, token_bytes=TOKEN_BYTES, log=lines.append)
    assert [p.name for p in checkpoints(out)] == ["ckpt_000002.pt", "ckpt_000003.pt"]
    assert sorted(read_run(out)["checkpoints"]) == ["ckpt_000002.pt", "ckpt_000003.pt"]
    assert "--overwrite: removed ckpt_000004.pt, ckpt_000006.pt from " + str(out) in lines
    assert latest_checkpoint(out).name == "ckpt_000003.pt" == Path(rewound.checkpoint).name
    assert trace_step(out, 3)["replayed_from"] == "ckpt_000002.pt"
    assert run(pretrain_cache, out, steps=4, resume="latest").step == 4


@pytest.mark.parametrize("where", ["user files", "file", "inside the data", "above the data", "a mixture's cache"])
def test_out_dirs_that_are_not_a_runs_are_refused_even_with_overwrite(tmp_path, pretrain_cache, where):
    import json
    import shutil

    data = pretrain_cache
    if where == "a mixture's cache":  # known only once the mixture file is read
        cache = shutil.copytree(pretrain_cache, tmp_path / "web")
        data = tmp_path / "mix.json"
        data.write_text(json.dumps({"seed": 0, "datasets": {"web": str(cache)}, "weights": {"web": 1.0}}))
        out, match = cache / "ckpts", "inside the data directory"
    elif where == "user files":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("keep me")
        match = "holds files this trainer did not write \\(notes.txt\\)"
    elif where == "file":
        out = tmp_path / "f"
        out.write_text("keep me")
        match = "a file, not a directory"
    else:
        data = shutil.copytree(pretrain_cache, tmp_path / "cache" / "web")
        out = data / "ckpts" if where == "inside the data" else tmp_path / "cache"
        match = "inside the data directory" if where == "inside the data" else "holds the data"
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(OutputRefused, match=match):
        run(data, out, overwrite=True)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_changed_byte_in_a_weight_or_a_truncated_checkpoint_is_refused_on_resume(tmp_path, pretrain_cache):
    out = tmp_path / "run"
    run(pretrain_cache, out)
    ckpt = out / "ckpt_000002.pt"
    good = ckpt.read_bytes()
    weight = load_checkpoint(ckpt)["model"]["transformer.wte.weight"]
    at = good.find(weight[3].numpy().tobytes())  # the raw bytes of row 3 of the embedding, inside the zip
    assert at > 0
    ckpt.write_bytes(good[:at + 5] + bytes([good[at + 5] ^ 0x10]) + good[at + 6:])
    assert torch.load(ckpt, weights_only=True)["step"] == 2  # torch itself does not notice
    with pytest.raises(StateError, match=r"ckpt_000002.pt: checksum mismatch: the file changed after it was "
                                         r"written .* --resume .*ckpt_000001.pt"):
        run(pretrain_cache, out, steps=3, resume="latest")
    ckpt.write_bytes(good[: len(good) // 2])
    with pytest.raises(StateError, match="ckpt_000002.pt: not a readable checkpoint"):
        run(pretrain_cache, out, steps=3, resume=str(ckpt))
    ckpt.write_bytes(good)
    assert run(pretrain_cache, out, steps=3, resume="latest").step == 3


def test_the_digest_covers_every_tensor_byte_and_value():
    a = {"model": {"w": torch.arange(6.0)}, "step": 2, "rng": [torch.zeros(3, dtype=torch.uint8)]}
    base = payload_digest(a)
    assert payload_digest({**a, "step": 3}) != base
    assert payload_digest({**a, "model": {"w": torch.arange(6.0).view(2, 3)}}) != base  # shape counts
    assert payload_digest({**a, "model": {"w": torch.arange(6, dtype=torch.float64)}}) != base  # dtype counts
    w = torch.arange(6.0)
    w[4] = torch.nextafter(w[4], torch.tensor(10.0))  # one ulp
    assert payload_digest({**a, "model": {"w": w}}) != base


def test_a_non_finite_loss_stops_the_run_before_it_saves_anything(tmp_path, pretrain_cache):
    base = tmp_path / "base"
    run(pretrain_cache, base, steps=1)
    ckpt = load_checkpoint(base / "ckpt_000001.pt")
    ckpt["model"]["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")  # a model that went bad in memory
    poisoned = tmp_path / "poisoned" / "ckpt_000001.pt"
    save_checkpoint(poisoned, {k: v for k, v in ckpt.items() if k != "verified"})
    out = tmp_path / "run"
    run(pretrain_cache, out, steps=1)
    before = snapshot(out)
    with pytest.raises(DivergedError, match=r"step 1: the loss is nan; stopped before saving anything"):
        run(pretrain_cache, out, init_from=str(poisoned), overwrite=True)
    assert snapshot(out) == before  # --overwrite replaces the old run only once the new one has saved


def test_init_from_starts_a_new_run_from_another_runs_weights(tmp_path, pretrain_cache, packed_dir):
    base = run(pretrain_cache, tmp_path / "base", steps=1)
    sft = run(packed_dir, tmp_path / "sft", init_from=base.checkpoint, sequence_len=32, device_batch_size=2,
              steps=1, save_every=0)
    assert sft.step == 1 and sft.losses[0] < base.losses[0] + 5
    start = load_checkpoint(base.checkpoint)["model"]["transformer.wte.weight"]
    assert not torch.equal(sft.model.transformer.wte.weight.detach(), start)  # trained on from there
    assert read_run(tmp_path / "sft")["init_from"] == base.checkpoint
    with pytest.raises(ConfigError, match="--depth 2: the --init-from checkpoint .* has n_layer = 1"):
        run(packed_dir, tmp_path / "sft2", init_from=base.checkpoint, sequence_len=32, depth=2)
    with pytest.raises(ConfigError, match="--resume and --init-from both given"):
        run(pretrain_cache, tmp_path / "sft3", init_from=base.checkpoint, resume="latest")


def test_init_from_refuses_a_model_of_another_tokenizer(tmp_path, pretrain_cache, tokenizer):
    kw = {"tokenizer": str(tokenizer.model_path)}
    base = run(pretrain_cache, tmp_path / "base", steps=1, **kw)
    ckpt = load_checkpoint(base.checkpoint)
    assert ckpt["tokenizer_sha256"] == tokenizer.sha256
    ckpt.pop("verified")
    save_checkpoint(tmp_path / "other" / "ckpt_000001.pt", {**ckpt, "tokenizer_sha256": "ab" * 32})
    with pytest.raises(ConfigError, match=r"trained with another tokenizer \(sha256 abababababab"):
        run(pretrain_cache, tmp_path / "sft", init_from=str(tmp_path / "other" / "ckpt_000001.pt"), **kw)


def test_checkpoints_from_step_one_million_on_are_the_runs_own_and_ordered_by_step(tmp_path, pretrain_cache):
    out = tmp_path / "run"
    run(pretrain_cache, out)
    ckpt = load_checkpoint(out / "ckpt_000002.pt")
    ckpt.pop("verified")
    for step in (999_999, 1_000_000):  # the library's own saver, at a faked step
        save_checkpoint(out / f"ckpt_{step}.pt", {**ckpt, "step": step})
    with pytest.raises(OutputRefused, match=r"holds a run on .*checkpoints at steps 1, 2, 999999, 1000000; continue"):
        run(pretrain_cache, out, seed=1)
    resumed = run(pretrain_cache, out, steps=1_000_001, resume="latest")  # not ckpt_999999.pt: by step, not by name
    assert resumed.step == 1_000_001 and len(resumed.losses) == 1
    assert resumed.checkpoint.endswith("ckpt_1000001.pt")
    # five checkpoints: the last four are named, the dots stand where the earlier one is left out
    with pytest.raises(OutputRefused, match=r"checkpoints at steps \.\.\., 2, 999999, 1000000, 1000001; continue"):
        run(pretrain_cache, out, seed=1)
    assert latest_checkpoint(out).name == "ckpt_1000001.pt"


def test_init_from_refuses_packed_bins_of_another_tokenizer_when_their_sft_cache_is_gone(tmp_path, pretrain_cache,
                                                                                       tokenizer):
    """The packed manifest records the tokenizer of the SFT cache the bins came from: with that cache gone
    (so --vocab-size is needed), it is still compared with the checkpoint's."""
    import json

    from niels_gpt.meta import write_meta
    from niels_gpt.packing import pack_sft

    from ..conftest import write_sft_cache
    from .conftest import chat

    sft = write_sft_cache(tmp_path / "sft", [chat(i, 3 + i % 5, 2 + i % 7) for i in range(40)])
    meta = json.loads((sft / "meta.json").read_text())
    write_meta(str(sft), {**meta, "tokenizer_sha256": "cd" * 32})  # built with another tokenizer
    pack_sft(sft, tmp_path / "bins", pack_size=32, algorithm="ffd", on_overflow="truncate")
    base = run(pretrain_cache, tmp_path / "base", steps=1, tokenizer=str(tokenizer.model_path))
    assert load_checkpoint(base.checkpoint)["tokenizer_sha256"] == tokenizer.sha256
    import shutil

    shutil.rmtree(sft)
    kw = dict(init_from=base.checkpoint, sequence_len=32, device_batch_size=2, steps=1, vocab_size=VOCAB)
    with pytest.raises(ConfigError, match=rf"--init-from .*ckpt_000001.pt: its model was trained with another "
                                          rf"tokenizer \(sha256 {tokenizer.sha256[:12]}\.\.\.\) than .*bins was "
                                          rf"built with \(cdcdcdcdcdcd\.\.\.\).*{tokenizer.model_path}"):
        run(tmp_path / "bins", tmp_path / "sft-run", **kw)
    assert not (tmp_path / "sft-run").exists()
    ckpt = load_checkpoint(base.checkpoint)
    ckpt.pop("verified")
    save_checkpoint(tmp_path / "cd" / "ckpt_000001.pt", {**ckpt, "tokenizer_sha256": "cd" * 32})
    sft_run = run(tmp_path / "bins", tmp_path / "sft-run", **{**kw, "init_from": str(tmp_path / "cd" /
                                                                                     "ckpt_000001.pt")})
    assert load_checkpoint(sft_run.checkpoint)["tokenizer_sha256"] == "cd" * 32  # what its data records


def test_a_version_one_checkpoint_loads_unverified_and_a_newer_one_needs_its_checksum(tmp_path, pretrain_cache):
    """Checkpoints written before the checksum (version 1) still load, marked unverified; a version-2 file whose
    checksum was stripped is refused, so removing the digest is no way around the check."""
    base = run(pretrain_cache, tmp_path / "base", steps=1)
    ckpt = torch.load(base.checkpoint, map_location="cpu", weights_only=True)
    assert ckpt["version"] == 2 and load_checkpoint(base.checkpoint)["verified"] is True
    torch.save({**{k: v for k, v in ckpt.items() if k != "sha256"}, "version": 1}, tmp_path / "v1.pt")
    old = load_checkpoint(tmp_path / "v1.pt")
    assert old["verified"] is False
    assert torch.equal(old["model"]["transformer.wte.weight"], ckpt["model"]["transformer.wte.weight"])
    torch.save({k: v for k, v in ckpt.items() if k != "sha256"}, tmp_path / "stripped.pt")
    with pytest.raises(StateError, match=r"stripped\.pt: its checksum is missing, so it cannot be trusted"):
        load_checkpoint(tmp_path / "stripped.pt")
