"""The entrance of the library against the field, in one run on the same files: tokenizer training, encoding,
and the start-up of `build`.

    pip install ".[bench-tokenizers,tiktoken]"; python bench/bench_entrance.py   # ~3 min on 2 cores, no network

On debian-docs (../shared/data/bulk-text/debian-docs.jsonl): the first --train-chars characters of documents
are the training text, the next --heldout-docs documents the held-out text.
1. Training a --vocab tokenizer: wall time and bytes per token of the held-out text, for
   - ours: `python -m niels_gpt train-tokenizer` on a JSON Lines file of the training documents (the whole
     process: start-up, reading, training, writing), the default (sentencepiece BPE, byte fallback), with
     --max-chars (a seeded sample of a third of the characters, 10,000 a document), --model-type unigram and
     --trainer rustbpe (rustbpe's BPE behind the command, written as a .tiktoken tokenizer);
   - bare: rustbpe 0.1 (nanochat's trainer, GPT-4 split), sentencepiece BPE and unigram with the library's
     settings (sentencepiece's own trainer, in this process), HF tokenizers' BpeTrainer (GPT-2 byte level);
   and each one's time as a multiple of bare rustbpe's; then ours with --trainer rustbpe against bare rustbpe
   (start-up included) and its bytes per token against the default's.
2. Encoding, and `build` against the bare fast encoder: bench/bench_fast_encoder.py (its docstring says what);
3. start-up: `build`'s whole process against its own wall time from its first task (both from 2.).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
DATA = ROOT.parent / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"


def split_docs(train_chars: int, heldout_docs: int) -> tuple[list[str], list[str]]:
    train, held, size = [], [], 0
    with open(DATA, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line).get("text")
            if not isinstance(text, str) or not text.strip():
                continue
            if size < train_chars:
                train.append(text)
                size += len(text)
            elif len(held) < heldout_docs:
                held.append(text)
            else:
                break
    return train, held


def bytes_per_token(encode_all, held: list[str]) -> float:
    return sum(len(t.encode("utf-8")) for t in held) / sum(len(ids) for ids in encode_all(held))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def ours(train_file: Path, out: Path, vocab: int, *extra: str) -> tuple[float, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "niels_gpt", "train-tokenizer", str(train_file), "--out", str(out), "--vocab-size",
           str(vocab), "--no-progress", *extra]
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # once: compiled modules cached, as for a user
    subprocess.run(["rm", "-rf", str(out)], check=True)
    dt, _ = timed(lambda: subprocess.run(cmd, check=True, capture_output=True, env=env))
    from niels_gpt.tokenizer import load_tokenizer

    return dt, load_tokenizer(out)


def training(train: list[str], held: list[str], vocab: int, work: Path) -> list[tuple[str, float, float]]:
    import rustbpe
    import sentencepiece as spm
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers

    from niels_gpt.tokenizer.spm import TrainSettings, train_sentencepiece

    rows = []
    def bare_rustbpe():
        tok = rustbpe.Tokenizer()
        tok.train_from_iterator(iter(train), vocab)
        return tok
    dt, r = timed(bare_rustbpe)
    rows.append(("rustbpe 0.1 (bare, GPT-4 split)", dt, bytes_per_token(r.batch_encode, held)))

    def hf():
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(train, trainers.BpeTrainer(
            vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        return tok
    dt, tok = timed(hf)
    rows.append(("HF tokenizers BpeTrainer (bare, GPT-2 byte level)", dt,
                 bytes_per_token(lambda h: [e.ids for e in tok.encode_batch(h)], held)))
    for kind in ("bpe", "unigram"):
        dt, (model, _) = timed(lambda kind=kind: train_sentencepiece(train, TrainSettings(vocab_size=vocab,
                                                                                          model_type=kind)))
        sp = spm.SentencePieceProcessor(model_proto=model)
        rows.append((f"sentencepiece {kind} (bare, the library's settings)", dt,
                     bytes_per_token(lambda h, sp=sp: sp.encode(h), held)))
    train_file = work / "train.jsonl"
    with open(train_file, "w", encoding="utf-8") as f:
        for t in train:
            f.write(json.dumps({"text": t}) + "\n")
    third = sum(map(len, train)) // 3
    for label, extra in (("ours: train-tokenizer (default: bpe)", ()),
                         (f"ours: train-tokenizer --max-chars {third:,}", ("--max-chars", str(third))),
                         ("ours: train-tokenizer --model-type unigram", ("--model-type", "unigram")),
                         ("ours: train-tokenizer --trainer rustbpe", ("--trainer", "rustbpe"))):
        dt, tok = ours(train_file, work / f"tok-{len(rows)}", vocab, *extra)
        rows.append((label + " (whole process)", dt, bytes_per_token(lambda h, tok=tok: tok.encode_batch(h), held)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-chars", type=int, default=7_500_000)
    ap.add_argument("--heldout-docs", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--skip-encode", action="store_true", help="section 1 only")
    args = ap.parse_args()
    train, held = split_docs(args.train_chars, args.heldout_docs)
    print(f"debian-docs: training text {len(train):,} documents, {sum(map(len, train)) / 1e6:.1f} M characters; "
          f"held-out {len(held):,} documents, {sum(map(len, held)) / 1e6:.1f} M characters; {os.cpu_count()} cores")
    print(f"\n1. training a {args.vocab:,}-piece tokenizer: wall time, x bare rustbpe, held-out bytes per token")
    with tempfile.TemporaryDirectory(prefix="bench-entrance-") as tmp:
        rows = training(train, held, args.vocab, Path(tmp))
    base = rows[0][1]
    for label, dt, bpt in rows:
        print(f"  {label:<62} {dt:7.2f} s {dt / base:6.2f}x {bpt:6.3f} bytes/token")
    ours_rust, default = rows[-1], rows[-4]
    print(f"  --trainer rustbpe: {ours_rust[1] / base:.2f}x bare rustbpe's time (start-up included); held-out "
          f"{ours_rust[2]:.3f} bytes/token against the default's {default[2]:.3f} ({ours_rust[2] / default[2]:.3f}x)")
    if not args.skip_encode:
        print("\n2.-3. encoding (bench/bench_fast_encoder.py: debian-docs, then every text file of ../shared/data)", flush=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fast_encoder.py"), "--repeat", "2"], check=True,
                       env={**env, "PYTHONPATH": str(ROOT)})


if __name__ == "__main__":
    main()
