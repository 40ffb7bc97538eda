"""`sample`: a checkpoint's model continues a prompt, token by token, as its own forward pass says."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.cache.cli import main as cli
from niels_gpt.train.sample import load_model, prompt_ids, sample
from niels_gpt.train.train import TrainConfig, train

from .conftest import TINY


@pytest.fixture(scope="module")
def trained(tmp_path_factory, pretrain_cache, tokenizer) -> str:
    out = tmp_path_factory.mktemp("sample") / "run"
    r = train(TrainConfig(data=str(pretrain_cache), out_dir=str(out), tokenizer=str(tokenizer.model_path),
                          **{**TINY, "steps": 3}), log=lambda *a: None)
    return r.checkpoint


def test_greedy_sampling_is_the_argmax_of_the_models_own_forward(trained, tokenizer):
    got = sample(trained, "The house", max_tokens=6, temperature=0, device="cpu")
    model, _ = load_model(trained, torch.device("cpu"))
    ids, stop = prompt_ids(tokenizer, "The house", chat=False)
    assert ids[0] == tokenizer.separator.id and ids[1:] == tokenizer.encode("The house")  # a document's start
    want = []
    with torch.no_grad():
        for _ in range(6):
            nxt = int(model(torch.tensor([ids + want]))[0, -1].argmax())
            if nxt in stop:
                break
            want.append(nxt)
    assert got == tokenizer.decode(want)
    drawn = [sample(trained, "The house", max_tokens=6, seed=3, device="cpu") for _ in range(2)]
    assert drawn[0] == drawn[1]  # seeded: the same draw every time


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is there: --device cuda runs")
def test_sample_on_cuda_without_it_says_how_to_sample_not_how_to_train(trained, capsys):
    """The device error was the trainer's: 'train with --device cpu'."""
    assert cli(["sample", trained, "--prompt", "The house", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "--device cuda:" in err and "run with --device cpu" in err and "train with" not in err, err


def test_a_chat_prompt_is_the_user_turn_then_the_assistant_sentinel(tokenizer):
    ids, stop = prompt_ids(tokenizer, "hi there", chat=True)
    assert ids == [*tokenizer.render_chat([{"role": "user", "content": "hi there"}]).ids, tokenizer.asst_id]
    assert stop == {tokenizer.eot_id}


def test_a_system_prompt_is_the_turn_before_the_users(tokenizer):
    ids, stop = prompt_ids(tokenizer, "hi there", chat=True, system="Be brief.")
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
    assert ids == [*tokenizer.render_chat(turns).ids, tokenizer.asst_id]
    assert ids[0] == tokenizer.special_ids["sys"] and stop == {tokenizer.eot_id}


def test_the_sample_command_takes_a_system_prompt(trained, capsys):
    assert cli(["sample", trained, "--prompt", "Once", "--system", "Be brief.", "--chat", "--max-tokens", "4",
                "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Once ->")


def test_the_sample_command_prints_the_prompt_and_its_continuation(trained, capsys):
    assert cli(["sample", trained, "--prompt", "Once", "--max-tokens", "4", "--temperature", "0", "--chat"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Once ->") and out.count("\n") >= 1


def test_a_tokenizer_other_than_the_recorded_one_is_refused_though_the_sizes_match(trained, tokenizer, tmp_path):
    from niels_gpt.errors import ConfigError
    from niels_gpt.train.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(trained)
    ckpt.pop("verified")
    other = tmp_path / "run" / "ckpt_000003.pt"
    save_checkpoint(other, {**ckpt, "tokenizer_sha256": "ef" * 32})  # trained with another tokenizer of this size
    with pytest.raises(ConfigError, match=rf"--tokenizer {tokenizer.model_path} is not the tokenizer its model was "
                                          rf"trained with \(sha256 {tokenizer.sha256[:12]}\.\.\., the checkpoint "
                                          r"records efefefefefef\.\.\. of .*\): the ids would decode to other text"):
        sample(str(other), "The house", max_tokens=2, tokenizer=str(tokenizer.model_path), device="cpu")
    with pytest.raises(ConfigError, match="the tokenizer found for it .* is not the tokenizer its model"):
        sample(str(other), "The house", max_tokens=2, device="cpu")
    assert sample(trained, "The house", max_tokens=2, tokenizer=str(tokenizer.model_path), device="cpu") is not None


def test_ctrl_c_prints_what_was_written_then_one_line(trained, monkeypatch, capsys):
    from niels_gpt.train.model import GPT

    want = sample(trained, "The house", max_tokens=3, temperature=0, device="cpu")
    forward, calls = GPT.forward, []

    def interrupted_at_the_fourth_token(self, *a, **kw):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return forward(self, *a, **kw)

    monkeypatch.setattr(GPT, "forward", interrupted_at_the_fourth_token)
    capsys.readouterr()
    status = cli(["sample", trained, "--prompt", "The house", "--temperature", "0", "--max-tokens", "10",
                  "--device", "cpu"])
    out, err = capsys.readouterr()
    assert status == 130
    assert out == f"The house{want}\n"  # the three tokens drawn before the Ctrl-C
    assert err.strip().splitlines() == ["error: sample interrupted after 3 of at most 10 tokens; the text above is "
                                        "what the model wrote until then"]
    assert "caches are intact" not in err
