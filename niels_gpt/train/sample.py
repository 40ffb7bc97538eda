"""`sample CKPT --prompt TEXT [--chat]`: what a checkpoint's model writes after a prompt.

The tokenizer: --tokenizer, else the run's, else one above its data. A base prompt starts after the
document separator; `--chat` renders a user turn (after `--system`) and opens the assistant's. Tokens are
drawn one at a time from the last `sequence_len` (no KV cache) until end-of-text or --max-tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from niels_gpt.constants import SEED
from niels_gpt.errors import ConfigError
from niels_gpt.seeds import check_seed
from niels_gpt.tokenizer import load_tokenizer
from niels_gpt.train.checkpoint import load_checkpoint
from niels_gpt.train.model import GPT, GPTConfig
from niels_gpt.train.setup import find_tokenizer, resolve_device


def load_model(path: str, device: torch.device) -> tuple[GPT, dict]:
    ckpt = load_checkpoint(path, flag="sample")
    model = GPT(GPTConfig(**ckpt["model_config"])).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def checkpoint_tokenizer(ckpt: dict, path: str, given: str | None):
    """--tokenizer, else the one the run recorded, else one above the run's data; ConfigError where it is not
    the tokenizer the checkpoint records (its sha256): the ids would decode to other text."""
    recorded = ckpt.get("tokenizer")
    data = (ckpt.get("train_config") or {}).get("data")
    if given:
        tok = load_tokenizer(given)
    elif recorded and Path(recorded).exists():
        tok = load_tokenizer(recorded)
    else:
        tok = find_tokenizer(data) if data and Path(str(data).split(",")[0]).exists() else None
    if tok is None:
        raise ConfigError(f"sample {path}: the tokenizer of this run is not where it was ({recorded or data}); "
                          "pass --tokenizer")
    if (sha := ckpt.get("tokenizer_sha256")) and sha != tok.sha256:
        what = f"--tokenizer {given}" if given else f"the tokenizer found for it ({tok.model_path})"
        raise ConfigError(f"sample {path}: {what} is not the tokenizer its model was trained with (sha256 "
                          f"{tok.sha256[:12]}..., the checkpoint records {sha[:12]}... of {recorded or 'its run'}): "
                          "the ids would decode to other text; pass the tokenizer the run was trained with")
    return tok


def prompt_ids(tok, prompt: str, chat: bool, system: str | None = None) -> tuple[list[int], set[int]]:
    """(ids to continue, ids that end the continuation); `system`: a system turn before the user's (chat)."""
    eot = tok.special_ids.get("eot")
    if system is not None and not chat:
        raise ConfigError("--system: a system prompt opens a conversation; sample with --chat (or put the text "
                          "into --prompt)")
    if not chat:
        sep = tok.separator
        return [sep.id, *tok.encode(prompt)], {sep.id} | ({eot} if eot is not None else set())
    turn = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": prompt}]
    if tok.chat_template is not None:
        from niels_gpt.tokenizer.chat import render_text  # lazy: jinja2 only for a chat template

        ids, _ = tok.encode_rendered(render_text(tok, turn, add_generation_prompt=True))
        return list(ids), {eot} if eot is not None else set()
    if not tok.library_conventions:
        raise ConfigError(f"--chat: the tokenizer {tok.model_path} has neither a chat template nor the library's "
                          "chat tokens; sample without --chat")
    return [*tok.render_chat(turn).ids, tok.asst_id], {eot}


class SampleInterrupted(KeyboardInterrupt):
    """Ctrl-C while sampling: `text` is what the model wrote until then, `tokens` how many ids."""

    def __init__(self, text: str, tokens: int):
        super().__init__(text)
        self.text, self.tokens = text, tokens


@torch.no_grad()
def generate(model: GPT, ids: list[int], *, max_tokens: int, temperature: float, top_k: int | None,
             generator: torch.Generator, stop: set[int], out: list[int]) -> None:
    """Append the sampled ids to `out` (a list the caller keeps: what was drawn before a Ctrl-C)."""
    device = next(model.parameters()).device
    window = model.config.sequence_len
    seq = list(ids)
    for _ in range(max_tokens):
        x = torch.tensor([seq[-window:]], dtype=torch.long, device=device)
        logits = model(x)[0, -1].float().cpu()
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if nxt in stop:
            break
        out.append(nxt)
        seq.append(nxt)


def sample(path: str, prompt: str, *, chat: bool = False, max_tokens: int = 64, temperature: float = 0.8,
           top_k: int | None = 50, seed: int = SEED, tokenizer: str | None = None, device: str = "auto",
           system: str | None = None) -> str:
    """The text the model at `path` writes after `prompt`."""
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens {max_tokens}: must be >= 1")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"--temperature {temperature}: must be a number >= 0 (0: always the most likely token; "
                          "0.8 by default)")
    if top_k is not None and top_k < 0:
        raise ConfigError(f"--top-k {top_k}: must be >= 0 (0: no cut)")
    check_seed(seed, "--seed")
    model, ckpt = load_model(path, resolve_device(device))
    tok = checkpoint_tokenizer(ckpt, path, tokenizer)
    if len(tok) > model.config.vocab_size:
        raise ConfigError(f"--tokenizer {tok.model_path}: {len(tok)} ids, but the model of {path} has "
                          f"{model.config.vocab_size} embedding rows: pass the tokenizer it was trained with")
    ids, stop = prompt_ids(tok, prompt, chat, system)
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    try:
        generate(model, ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k or None, generator=g,
                 stop=stop, out=out)
    except KeyboardInterrupt:
        raise SampleInterrupted(tok.decode(out), len(out)) from None
    return tok.decode(out)
