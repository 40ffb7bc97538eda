"""`build --chat` against rendering the same conversations in a loop with the tokenizer's own library.

The conversations: debian-docs (../shared/data/bulk-text/debian-docs.jsonl) as two-turn chats, each
document's first half the user's message and the rest the assistant's (--docs of them). Three tokenizers
trained on the first --train-chars (no network): the library's sentencepiece BPE (its four chat tokens:
rendered with the library's sentinels, each message by the fast encoder), a byte-level BPE tokenizer.json
with cl100k's split rule, `<|im_start|>`/`<|im_end|>` and a ChatML template (rendered whole by the template,
encoded by the tokenizers library with offsets), and a Mistral-style sentencepiece BPE model of its own
(`[INST]`/`[/INST]` control pieces) with Mistral's template. Figures in one run, best of --repeat, each a
fresh process:
1. the loop: `render_chat` of every conversation on one thread, as a script over the tokenizer would (the
   sentencepiece model: the tokenizer's own `encode` per message);
2. `python -m niels_gpt build --chat` of the JSON Lines file, --executor inline and processes, with
   `--val-frac 0` and `0.1`, the build's own wall time (and with NIELS_GPT_ENCODER=reference): tokens/s and
   the ratio to the loop, whether torch was imported; the builds of one tokenizer write the same files
   (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_fast_encoder import _env, read_docs, train

TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
            "'<|im_end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
           "[INST] {{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %} {{ m['content'] }}"
           "{{ eos_token }}{% endif %}{% endfor %}")


def mistral_like(docs: list[str], train_chars: int, vocab: int, out: Path) -> Path:
    """A sentencepiece BPE model of its own (`<s>`, `</s>`, `[INST]`/`[/INST]` control pieces, byte fallback,
    none of the library's sentinels) with Mistral's template in a tokenizer_config.json beside it."""
    import sentencepiece as spm

    sample, size = [], 0
    for d in docs:
        sample.append(d[:20_000])
        size += len(sample[-1])
        if size > train_chars:
            break
    out.mkdir()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_prefix=str(out / "tokenizer"), model_type="bpe",
        vocab_size=vocab, byte_fallback=True, character_coverage=0.9995,
        control_symbols=["[INST]", "[/INST]"], bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
        max_sentence_length=20_000, num_threads=os.cpu_count() or 1, minloglevel=2)
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": MISTRAL}))
    return out / "tokenizer.model"


def chatml(tokenizer_json: Path, out: Path) -> Path:
    """A tokenizer directory: `tokenizer_json` with the two ChatML tokens added, and a ChatML template."""
    config = json.loads(tokenizer_json.read_text())
    n = len(config["model"]["vocab"])
    config["added_tokens"] += [{"id": n + 1 + i, "content": t, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True}
                               for i, t in enumerate(("<|im_start|>", "<|im_end|>"))]
    out.mkdir()
    (out / "tokenizer.json").write_text(json.dumps(config))
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def loop(tokenizer: Path, convs: Path) -> tuple[float, int]:
    """(seconds, tokens) of render_chat over every conversation in a fresh process, the tokenizer loaded
    first."""
    code = ("import json, sys, time\nfrom niels_gpt.tokenizer import load_tokenizer\n"
            f"tok = load_tokenizer({str(tokenizer)!r})\n"
            f"convs = [json.loads(line)['messages'] for line in open({str(convs)!r})]\n"
            "t0 = time.perf_counter(); n = sum(len(tok.render_chat(c).ids) for c in convs)\n"
            "print(time.perf_counter() - t0, n)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    seconds, tokens = out.stdout.split()
    return float(seconds), int(tokens)


def build(tokenizer: Path, convs: Path, out: Path, executor: str, val_frac: str, reference: bool) -> tuple:
    """(the build's own wall seconds, tokens, torch imported, its files but meta.json)."""
    code = ("import sys\nfrom niels_gpt.cli import main\n"
            f"rc = main(['build', {str(convs)!r}, '--chat', '--out', {str(out)!r}, '--tokenizer', "
            f"{str(tokenizer)!r}, '--executor', {executor!r}, '--val-frac', {val_frac!r}, '--no-progress'])\n"
            "print('TORCH', 'torch' in sys.modules)\nsys.exit(rc)\n")
    env = {**_env(), **({"NIELS_GPT_ENCODER": "reference"} if reference else {})}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr)
    meta = json.loads((out / "meta.json").read_text())
    tokens = meta["totals"]["train_tokens"] + meta["totals"]["val_tokens"]
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "meta.json"}
    wall = float(re.search(r"([0-9.]+) s wall", proc.stdout).group(1))
    encoder = meta.get("encoder", "the tokenizer's own library")
    return wall, tokens, "TORCH True" in proc.stdout, files, encoder


def builds(label: str, tok: Path, convs: Path, tmp: Path, repeat: int, loop_rate: float) -> None:
    """Every build of step 2 for one tokenizer, each against the loop's tokens/s (NIELS_GPT_ENCODER=reference
    only where the fast encoder runs: a template's rendering is the tokenizer's own either way)."""
    first: dict = {}
    for reference in (False, True) if "template" not in label else (False,):
        for executor in ("inline", "processes"):
            for val_frac in ("0", "0.1"):
                runs = [build(tok, convs, tmp / f"{executor}-{val_frac}-{reference}-{i}", executor, val_frac,
                              reference) for i in range(repeat)]
                wall, n, torch, files, encoder = min(runs, key=lambda r: r[0])
                if first.setdefault(val_frac, files) != files:
                    raise SystemExit(f"{label}: {executor} --val-frac {val_frac} wrote other files")
                print(f"  build --chat --executor {executor:9s} --val-frac {val_frac:3s} ({encoder}): "
                      f"{n / wall / 1e6:6.2f} Mtok/s ({wall:.2f} s), {n / wall / loop_rate:5.2f}x the loop; "
                      f"torch imported: {torch}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=0, help="debian-docs documents made into chats (0: all)")
    ap.add_argument("--train-chars", type=int, default=3_000_000)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    docs = read_docs()[:args.docs or None]
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        tmp = Path(tmp)
        paths = train(docs, args.train_chars, args.vocab, tmp)
        convs = tmp / "convs.jsonl"
        with open(convs, "w", encoding="utf-8") as f:
            for d in docs:
                half = len(d) // 2
                f.write(json.dumps({"messages": [{"role": "user", "content": d[:half]},
                                                 {"role": "assistant", "content": d[half:]}]}) + "\n")
        print(f"{len(docs):,} conversations, {convs.stat().st_size / 1e6:.1f} MB of JSON Lines; "
              f"{os.cpu_count()} cores")
        tokenizers = {"sentencepiece BPE, the library's sentinels": paths["sentencepiece"],
                        "byte-level BPE tokenizer.json, a ChatML template":
                          chatml(tmp / "cl100k-bpe" / "tokenizer.json", tmp / "chatml"),
                      "a sentencepiece model of its own, Mistral's template":
                          mistral_like(docs, args.train_chars, args.vocab, tmp / "mistral")}
        for label, tok in tokenizers.items():
            seconds, tokens = min(loop(tok, convs) for _ in range(args.repeat))
            print(f"\n{label}\n  render_chat in a loop, one thread: {tokens / seconds / 1e6:6.2f} Mtok/s "
                  f"({seconds:.2f} s)")
            builds(label, tok, convs, tmp / label.split()[0], args.repeat, tokens / seconds)

if __name__ == "__main__":
    main()
