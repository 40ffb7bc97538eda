"""Build speed with each tokenizer backend against that backend's bare batch encoder, 1 and 2 workers.

On the debian-docs corpus (../shared/data/bulk-text/debian-docs.jsonl, "text" field; ../shared/data/SOURCES.md):
- sentencepiece: a 16k model trained here on the first --train-chars (the library's tokenizer, BPE by default);
- hf-tokenizers: a 16k byte-level BPE trained here with `tokenizers` (cl100k's split regex), as tokenizer.json;
- tiktoken (--tiktoken auto): the real cl100k_base where tiktoken can load it (its file in tiktoken's cache,
  TIKTOKEN_CACHE_DIR; tiktoken downloads it where there is a network and checks its sha256), else the same
  16k BPE's ranks written as a .tiktoken file (--tiktoken bpe: the same vocabulary; tiktoken merges by the
  rank of the result where `tokenizers` follows its merge list, so a few ids may differ).
For each: the bare encoder (`encode_batch` over 256-document batches, num_threads=1, and 2), then
build_pretrain_cache with num_workers=1 and 2. tokens/s = tokens written / wall time (one separator per
document counted on both sides), best of --repeat, contenders interleaved. Ratios are against the same
backend's bare 1-thread encoder, and the tiktoken build against the sentencepiece build, in chars/s of the
same text (and in tokens/s, which differ with the vocabulary).
NOTE: `tokenizers` spreads every encode_batch call over its own Rayon pool (one thread per core)
whatever num_threads says, so the "1 thread" baseline used to run on both cores and every HF ratio was
against a 2-core encoder. The library reads TOKENIZERS_PARALLELISM at each call, so the bench now sets it:
"false" for the bare 1-thread encoder and the builds (workers are then threads, as for the other
backends: encode_batch releases the GIL), "true" for the bare 2-thread figure (the Rayon pool on 2 cores)
and for one more HF contender, "build, 1 worker, Rayon pool", the library's default configuration.

Where gigatoken takes a backend's model (sentencepiece BPE, a `.tiktoken` file) the build encodes with it
(niels_gpt/tokenizer/fast.py), so its ratio to that backend's own encoder is the fast encoder's gain; the
`tokenizers` file here keeps its own library. Figures: README.md, "Measured".

    .venv/bin/python bench/bench_tokenizers.py                 # ~30 s on 2 cores
    .venv/bin/python bench/bench_tokenizers.py --chars 1e6 --train-chars 5e5 --vocab 4000 --repeat 1   # a check
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_cache_build import CORPUS, stream_docs
from bench_cache_common import table

from niels_gpt.cache.build_cache import build_pretrain_cache
from niels_gpt.errors import TokenizerError
from niels_gpt.tokenizer import TrainSettings, load_tokenizer, train_tokenizer

CHARS = 10_000_000
TRAIN_CHARS = 3_000_000
VOCAB = 16_000
REPEAT = 2
BATCH = 256
PARALLELISM = "TOKENIZERS_PARALLELISM"
BACKENDS = ["sentencepiece", "hf-tokenizers", "tiktoken"]


def train_bpe(texts: list[str], out: Path, vocab: int) -> tuple[Path, Path]:
    """A byte-level BPE as tokenizer.json and the same ranks as a .tiktoken file."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from niels_gpt.tokenizer.hf import _byte_decoder
    from niels_gpt.tokenizer.tiktoken_backend import CL100K_PATTERN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(CL100K_PATTERN), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["<|endoftext|>"])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    table_ = _byte_decoder()
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    lines = [base64.b64encode(bytes(table_[c] for c in t)).decode() + f" {r}"
             for t, r in sorted(vocab.items(), key=lambda kv: kv[1])]
    (out / "bpe.tiktoken").write_text("\n".join(lines) + "\n")
    return out / "tokenizer.json", out / "bpe.tiktoken"


def tiktoken_contender(spec: str, trained: Path):
    """cl100k_base (or the encoding named) where tiktoken has its file; the BPE trained here otherwise."""
    if spec == "bpe":
        return load_tokenizer(trained)
    try:
        tok = load_tokenizer("cl100k_base" if spec == "auto" else spec)
    except TokenizerError as exc:
        if spec != "auto":
            raise
        print(f"cl100k_base is not available here ({str(exc).splitlines()[0][:120]}...): the tiktoken contender "
              "is the 16k BPE trained here")
        return load_tokenizer(trained)
    print(f"tiktoken contender: {tok._path} ({len(tok):,} ids)")
    return tok


def bare(tok, texts, threads: int) -> int:
    return sum(len(ids) + 1 for i in range(0, len(texts), BATCH)
               for ids in tok.encode_batch(texts[i:i + BATCH], num_threads=threads))


def rayon(on: bool, fn):
    """`fn` with the `tokenizers` Rayon pool on or off (the library reads TOKENIZERS_PARALLELISM at every
    batch; the other backends ignore it)."""
    def run():
        old = os.environ.get(PARALLELISM)
        os.environ[PARALLELISM] = "true" if on else "false"
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop(PARALLELISM, None)
            else:
                os.environ[PARALLELISM] = old
    return run


def build(tok, texts, out: Path, workers: int) -> int:
    build_pretrain_cache(texts, str(out), tokenizer=tok, max_train_tokens=10**12, max_val_tokens=0,
                         shard_bytes=128 << 20, seed=0, shuffle_buffer=None, num_workers=workers,
                         dataset_name="debian-docs")
    totals = json.loads((out / "meta.json").read_text())["totals"]
    return totals["train_tokens"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--chars", type=float, default=CHARS, help="characters of the corpus to tokenize")
    ap.add_argument("--train-chars", type=float, default=TRAIN_CHARS, help="characters to train the tokenizers on")
    ap.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary of every tokenizer")
    ap.add_argument("--repeat", type=int, default=REPEAT, help="timed runs per contender (best is kept)")
    ap.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS, help="the backends to measure")
    ap.add_argument("--tiktoken", default="auto",
                    help="the tiktoken contender: an encoding name (cl100k_base, o200k_base; its file in tiktoken's "
                         "cache, TIKTOKEN_CACHE_DIR), 'bpe' for the 16k BPE trained here, or 'auto': cl100k_base "
                         "where tiktoken can load it, else the trained BPE")
    args = ap.parse_args(argv)
    if not CORPUS.exists():
        print(f"{CORPUS} is absent: nothing to measure")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train = list(stream_docs(limit_chars=int(args.train_chars)))
        t0 = time.perf_counter()
        spm = train_tokenizer(train, work / "spm", settings=TrainSettings(vocab_size=args.vocab))
        json_path, tt_path = train_bpe(train, work / "bpe", args.vocab)
        print(f"trained the tokenizers on {args.train_chars:,.0f} chars in {time.perf_counter() - t0:.1f} s", flush=True)
        toks = {"sentencepiece": spm, "hf-tokenizers": load_tokenizer(json_path),
                "tiktoken": tiktoken_contender(args.tiktoken, tt_path)}
        toks = {k: v for k, v in toks.items() if k in args.backends}
        texts = list(stream_docs(limit_chars=int(args.chars)))
        print(f"{len(texts)} documents, {sum(map(len, texts)):,} chars", flush=True)
        contenders = {}
        for name, tok in toks.items():
            contenders[(name, "bare encode_batch, 1 thread")] = rayon(False, lambda tok=tok: bare(tok, texts, 1))
            contenders[(name, "bare encode_batch, 2 threads")] = rayon(True, lambda tok=tok: bare(tok, texts, 2))
            for w in (1, 2):
                contenders[(name, f"build, {w} worker{'s' * (w > 1)}")] = \
                    rayon(False, lambda tok=tok, w=w, name=name: build(tok, texts, work / f"{name}-{w}", w))
            if name == "hf-tokenizers":  # the library's default: every batch on the Rayon pool
                contenders[(name, "build, 1 worker, Rayon pool")] = \
                    rayon(True, lambda tok=tok, name=name: build(tok, texts, work / f"{name}-rayon", 1))
        best: dict = {}
        tokens: dict = {}
        for _ in range(args.repeat):
            for key, fn in contenders.items():
                t0 = time.perf_counter()
                tokens[key] = fn()
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
        rate = {k: tokens[k] / best[k] for k in best}
        rows = [[b, c, tokens[(b, c)], rate[(b, c)] / 1e6, rate[(b, c)] / rate[(b, "bare encode_batch, 1 thread")],
                 rate[(b, c)] / rate[(b, "bare encode_batch, 2 threads")]] for b, c in rate]
        # x bare 2 threads: how near a build comes to the encoder's own 2-thread rate in the same run, which
        # says more than x bare 1 thread when other jobs take the second core for a while
        print(table(f"\nBuild speed by backend on debian-docs (best of {args.repeat})",
                    ["backend", "contender", "tokens", "Mtok/s", "x bare 1 thread", "x bare 2 threads"], rows))
        same = all((work / f"{n}-1" / "train" / "shard_00000.bin").read_bytes()
                   == (work / f"{n}-{w}" / "train" / "shard_00000.bin").read_bytes()
                   for n in toks for w in (["2", "rayon"] if n == "hf-tokenizers" else ["2"]))
        print(f"1-worker and 2-worker caches byte-identical for every backend: {same}")
        if not {"sentencepiece", "tiktoken"} <= set(toks):
            return 0
        b1 = "bare encode_batch, 1 thread"
        print(f"bare 1 thread, tiktoken / sentencepiece: {best[('sentencepiece', b1)] / best[('tiktoken', b1)]:.2f}x "
              f"(chars/s), {rate[('tiktoken', b1)] / rate[('sentencepiece', b1)]:.2f}x (tokens/s)")
        for w in ("build, 1 worker", "build, 2 workers"):
            print(f"tiktoken {w} / sentencepiece {w}: {best[('sentencepiece', w)] / best[('tiktoken', w)]:.2f}x "
                  f"(chars/s: the same text) and {rate[('tiktoken', w)] / rate[('sentencepiece', w)]:.2f}x "
                  "(tokens/s: different vocabularies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
