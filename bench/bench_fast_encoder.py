"""The fast encoder against the field, and `build` against the bare fast encoder, in one run on the same text.

On debian-docs (../shared/data/bulk-text/debian-docs.jsonl, "text" field, --docs documents), with
tokenizers trained here on its first --train-chars (no network needed):
- tiktoken: a --vocab byte-level BPE with cl100k's split regex, written as a .tiktoken file;
- hf-tokenizers: a --vocab byte-level BPE with GPT-2's pre-tokenizer, as tokenizer.json;
- sentencepiece: the library's trainer with model_type bpe (byte fallback), --vocab pieces.
Figures, tokens/s, best of --repeat:
1. each backend's own library (the reference encoder: tiktoken's uint32 buffers on one thread and on
   --workers threads, `tokenizers` encode_batch on its pool, sentencepiece on --workers threads) and
   gigatoken over the same documents, one thread (`encode` per document, as the builder calls it): warm,
   the best of --repeat passes of one encoder (from the second pass its pretoken cache holds the text's
   words), and once, a fresh encoder per pass (what a build does: it encodes each document once);
2. `python -m niels_gpt build` of a JSON Lines folder holding the same documents, tiktoken tokenizer,
   --executor inline and processes: cache tokens / wall time of the whole process, and the ratio to bare
   gigatoken on one thread, warm and once; its CPU time (workers included) and tokens per CPU-second against
   bare gigatoken's once (on a shared machine the CPU figures move less than the wall times); whether the
   build imported torch;
3. start-up: the wall time of `python -m niels_gpt build --help` (imports and the parser).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data" / "bulk-text" / "debian-docs.jsonl"


def read_docs(n: int | None) -> list[str]:
    out = []
    with open(DATA, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line).get("text")
            if isinstance(text, str) and text.strip():
                out.append(text)
            if n and len(out) >= n:
                break
    return out


def train(docs: list[str], train_chars: int, vocab: int, out: Path) -> dict[str, Path]:
    import tokenizers
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

    from niels_gpt.tokenizer import TrainSettings, train_tokenizer
    from niels_gpt.tokenizer.hf import _byte_decoder
    from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN

    sample, size = [], 0
    for d in docs:
        sample.append(d)
        size += len(d)
        if size > train_chars:
            break
    paths = {}
    for name, pre in (("cl100k-bpe", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])),
            ("gpt2-bpe", pre_tokenizers.ByteLevel(add_prefix_space=False))):
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(sample, trainers.BpeTrainer(
            vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
            special_tokens=["<|endoftext|>"]))
        (out / name).mkdir()
        tok.save(str(out / name / "tokenizer.json"))
        paths[name] = out / name / "tokenizer.json"
    table = _byte_decoder()
    vocab_map = json.loads(paths["cl100k-bpe"].read_text())["model"]["vocab"]
    ranks = sorted(((bytes(table[c] for c in t), r) for t, r in vocab_map.items() if t != "<|endoftext|>"),
                   key=lambda kv: kv[1])
    tt = out / "bpe.tiktoken"
    tt.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, (t, _) in enumerate(ranks)))
    spm = train_tokenizer(sample, out / "spm", settings=TrainSettings(vocab_size=vocab, model_type="bpe"))
    return {"tiktoken": tt, "hf-tokenizers": paths["gpt2-bpe"], "sentencepiece": Path(spm.model_path)}


def best(fn, repeat: int) -> tuple[float, int]:
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        tokens = fn()
        dt = time.perf_counter() - t0
        out = min(out or (dt, tokens), (dt, tokens))
    return out


def batches(docs: list[str], n: int = 256):
    return [docs[i:i + n] for i in range(0, len(docs), n)]


def reference(tok, docs: list[str], workers: int) -> int:
    parts = batches(docs)
    encode = getattr(tok, "encode_batch_arrays", None) or (lambda b: tok.encode_batch(b, num_threads=1))
    if workers <= 1:
        return sum(len(ids) for b in parts for ids in encode(b))
    with ThreadPoolExecutor(workers) as pool:
        return sum(len(ids) for out in pool.map(encode, parts) for ids in out)


def _env() -> dict:
    """This checkout on the path, and compiled modules cached as a user's installation has them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def build(tiktoken_file: Path, folder: Path, out: Path, executor: str,
          workers: int) -> tuple[float, int, bool, float, float]:
    code = ("import sys, time\nt0 = time.perf_counter()\nfrom niels_gpt.cli import main\n"
            f"rc = main(['build', '--out', {str(out)!r}, '--tokenizer', {str(tiktoken_file)!r}, '--executor', "
            f"{executor!r}, '--workers', '{workers}', '--no-progress', {str(folder)!r}])\n"
            "print('TORCH', 'torch' in sys.modules)\nsys.exit(rc)\n")
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime  # the process and its workers
    if proc.returncode:
        raise SystemExit(proc.stderr)
    meta = json.loads((out / "meta.json").read_text())
    tokens = meta["totals"]["train_tokens"] + meta["totals"]["val_tokens"]
    work = float(re.search(r"([0-9.]+) s wall", proc.stdout).group(1))  # the build's own figure: after start-up
    return wall, tokens, "TORCH True" in proc.stdout, work, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=None, help="documents of debian-docs (default: all)")
    ap.add_argument("--train-chars", type=int, default=3_000_000)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--reference-docs", type=int, default=800,
                    help="documents the (slower) reference encoders encode, the first of --docs")
    args = ap.parse_args()

    import gigatoken  # noqa: F401 - the fast encoder must be installed for this bench

    from niels_gpt.tokenizer import load_tokenizer
    from niels_gpt.tokenizer.fast import fast_encoder

    docs = read_docs(args.docs)
    chars = sum(map(len, docs))
    print(f"debian-docs: {len(docs):,} documents, {chars / 1e6:.1f} M characters; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-fast-") as tmp:
        tmp = Path(tmp)
        paths = train(docs, args.train_chars, args.vocab, tmp)
        bare_fast, bare_once, bare_cpu = {}, {}, {}
        for kind, path in paths.items():
            tok = load_tokenizer(path)
            fast = fast_encoder(tok)
            if fast is None:
                print(f"{kind}: no fast encoder for this tokenizer")
                continue
            dt, n = best(lambda f=fast: sum(len(a) for b in batches(docs, 4096) for a in f.encode_arrays(b)),
                         args.repeat)
            bare_fast[kind] = n / dt
            print(f"{kind:14s} gigatoken ({fast.name}), one thread, warm: {n / dt / 1e6:7.2f} Mtok/s ({n:,} tokens)")
            once, cpus = [], []
            for _ in range(args.repeat):  # a fresh encoder each time: every word met for the first time
                f = fast_encoder(load_tokenizer(path))
                c0 = time.process_time()
                once.append(best(lambda f=f: sum(len(a) for b in batches(docs, 4096) for a in f.encode_arrays(b)), 1))
                cpus.append(time.process_time() - c0)
            dt, n = min(once)
            bare_once[kind] = n / dt
            bare_cpu[kind] = n / min(cpus)
            print(f"{kind:14s} gigatoken ({fast.name}), one thread, once: {n / dt / 1e6:7.2f} Mtok/s, "
                  f"{n / min(cpus) / 1e6:7.2f} Mtok per CPU-second")
            os.environ["TOKENIZERS_PARALLELISM"] = "true"
            for w in sorted({1, args.workers}):
                dt, n = best(lambda t=tok, w=w: reference(t, docs[:args.reference_docs], w), args.repeat)
                print(f"{kind:14s} its own library, {w} thread(s): {n / dt / 1e6:7.2f} Mtok/s")
        folder = tmp / "jsonl"
        folder.mkdir()
        with open(folder / "docs.jsonl", "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        for executor in ("inline", "processes"):
            runs = []
            for i in range(args.repeat):
                runs.append(build(paths["tiktoken"], folder, tmp / f"c-{executor}-{i}", executor, args.workers))
            wall, tokens, torch, work, _ = min(runs)
            cpu = min(r[4] for r in runs)
            for what, dt in (("whole process", wall), ("its own wall time", work)):
                rate = tokens / dt
                print(f"build --executor {executor:9s} (tiktoken, {what}): {rate / 1e6:7.2f} Mtok/s, {dt:.2f} s, "
                      f"{rate / bare_fast['tiktoken']:.2f}x bare gigatoken warm, "
                      f"{rate / bare_once['tiktoken']:.2f}x once")
            print(f"build --executor {executor:9s}: torch imported: {torch}; start-up before its first task "
                  f"{wall - work:.2f} s; {cpu:.2f} s of CPU for the whole process (workers included): "
                  f"{tokens / cpu / 1e6:.2f} Mtok per CPU-second, {tokens / cpu / bare_cpu['tiktoken']:.2f}x bare "
                  "gigatoken's once")
        helps = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "niels_gpt", "build", "--help"], capture_output=True, check=True,
                           env=_env())
            helps.append(time.perf_counter() - t0)
        print(f"start-up: `python -m niels_gpt build --help` {min(helps):.2f} s (best of 3)")


if __name__ == "__main__":
    main()
