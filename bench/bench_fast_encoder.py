"""The fast encoder against the field, and `build` against the bare fast encoder, in one run on the same text.

Tokenizers are trained on debian-docs' first --train-chars (../shared/data/bulk-text/debian-docs.jsonl; no
network): tiktoken (a --vocab byte-level BPE with cl100k's split regex, a .tiktoken file), hf-tokenizers (GPT-2
byte level, tokenizer.json) and sentencepiece (the library's trainer, BPE). Figures, tokens/s, best of --repeat:
1. debian-docs, each backend: gigatoken one thread (`encode` per document, as the builder calls it), warm (one
   encoder, from its second pass its pretoken cache holds the text's words) and once (a fresh encoder per pass:
   a build encodes each document once), and each tokenizer's own library on one thread and on --workers threads;
2. per --corpora (debian-docs; all-text: every text file of ../shared/data, debian-docs, the Gutenberg books,
   wikitext, tinyshakespeare and the web sample, each as a JSON Lines file; `xN`: N copies), tiktoken tokenizer:
   bare gigatoken on one thread and on --workers (`encode` per document on a thread pool sharing one encoder,
   and gigatoken's own `encode_batch` on its rayon pool), warm and once (and once on one thread with the
   encoder made from the tokenizer file inside the clock, as a build makes it); then `python -m niels_gpt build` of
   the folder, --executor inline and processes: tokens/s from its first task (the build's own wall time) and
   for the whole process, each as a ratio to every bare figure, its CPU time (workers included) and tokens
   per CPU-second against bare gigatoken's once on one thread, whether it imported torch; with --parquet ROWS,
   the same for the same files written as Parquet (ROWS rows a row group);
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
SHARED = ROOT.parent / "shared" / "data"
DATA = SHARED / "bulk-text" / "debian-docs.jsonl"


def read_docs(path: Path = DATA) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [t for line in f if isinstance(t := json.loads(line).get("text"), str) and t.strip()]


def corpus(name: str) -> dict[str, list[str]]:
    """JSON Lines file name -> its documents."""
    base, copies = re.fullmatch(r"(.*?)(?:-x(\d+))?", name).groups()
    files = {"debian-docs": read_docs()}
    if base != "debian-docs":
        files["web"] = [d for p in sorted((SHARED / "web-cc-sample").glob("*.jsonl")) for d in read_docs(p)]
        for folder in ("gutenberg", "wikitext", "tinyshakespeare"):
            files[folder] = [p.read_text(encoding="utf-8") for p in sorted((SHARED / folder).iterdir())]
    return {f"{k}-{i}": v for i in range(int(copies or 1)) for k, v in files.items()}


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



def best(fn, repeat: int, setup=lambda: None) -> tuple[float, int, float]:
    """(wall seconds, tokens, CPU seconds) of fn(setup()), the least wall time of `repeat` runs; setup() (a
    fresh encoder) runs before the clocks start."""
    out = []
    for _ in range(repeat):
        arg = setup()
        t0, c0 = time.perf_counter(), time.process_time()
        tokens = fn(arg)
        out.append((time.perf_counter() - t0, tokens, time.process_time() - c0))
    return min(out)


def batches(docs: list[str], n: int = 256):
    return [docs[i:i + n] for i in range(0, len(docs), n)]


def reference(tok, docs: list[str], workers: int) -> int:
    parts = batches(docs)
    encode = getattr(tok, "encode_batch_arrays", None) or (lambda b: tok.encode_batch(b, num_threads=1))
    if workers <= 1:
        return sum(len(ids) for b in parts for ids in encode(b))
    with ThreadPoolExecutor(workers) as pool:
        return sum(len(ids) for out in pool.map(encode, parts) for ids in out)


def bare(giga, docs: list[str], threads: int, how: str) -> int:
    """Tokens of `docs` encoded by the gigatoken Tokenizer `giga`: `encode` per document on `threads` threads
    sharing it, or its `encode_batch` (rayon, every core) 256 documents a call."""
    if how == "encode_batch":
        import awkward  # imported before the clock starts by main()
        return sum(int(awkward.count(giga.encode_batch(b, parallel=True))) for b in batches(docs))
    if threads == 1:
        return sum(len(giga.encode(d)) for d in docs)
    with ThreadPoolExecutor(threads) as pool:
        return sum(len(ids) for ids in pool.map(giga.encode, docs, chunksize=16))


def _env() -> dict:
    """This checkout on the path, and compiled modules cached as a user's installation has them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def build(tiktoken_file: Path, folder: Path, out: Path, executor: str, workers: int) -> tuple:
    """(whole-process wall, tokens, torch imported, the build's own wall time, CPU with its workers)."""
    # as `python -m niels_gpt build ...` runs (niels_gpt/__main__.py), saying at its exit whether torch was imported
    code = ("import atexit, sys\nfrom niels_gpt.__main__ import run\n"
            f"sys.argv = ['niels-gpt-data', 'build', '--out', {str(out)!r}, '--tokenizer', {str(tiktoken_file)!r}, "
            f"'--executor', {executor!r}, '--workers', '{workers}', '--no-progress', {str(folder)!r}]\n"
            "atexit.register(lambda: print('TORCH', 'torch' in sys.modules))\nrun()\n")
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


def encoders(paths: dict, docs: list[str], args) -> None:
    from niels_gpt.tokenizer import load_tokenizer
    from niels_gpt.tokenizer.fast import fast_encoder

    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    for kind, path in paths.items():
        tok = load_tokenizer(path)
        fast = fast_encoder(tok)
        if fast is None:
            print(f"{kind}: no fast encoder for this tokenizer")
            continue
        for label, make in (("warm", lambda f=fast: f.giga), ("once", lambda p=path: fast_encoder(load_tokenizer(p)).giga)):
            dt, n, cpu = best(lambda g: bare(g, docs, 1, "encode"), args.repeat, make)
            print(f"{kind:14s} gigatoken ({fast.name}), one thread, {label}: {n / dt / 1e6:7.2f} Mtok/s, "
                  f"{n / cpu / 1e6:7.2f} Mtok per CPU-second ({n:,} tokens)")
        for w in sorted({1, args.workers}):
            dt, n, _ = best(lambda _, t=tok, w=w: reference(t, docs[:args.reference_docs], w), args.repeat)
            print(f"{kind:14s} its own library, {w} thread(s): {n / dt / 1e6:7.2f} Mtok/s")


def builds(name: str, tiktoken_file: Path, tmp: Path, args) -> None:
    import gigatoken

    files = corpus(name)
    folder = tmp / name
    folder.mkdir()
    for stem, docs in files.items():
        with open(folder / f"{stem}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    docs = [d for stem in sorted(files) for d in files[stem]]  # the order the build reads the folder in
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(f"\n{name}: {len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} M characters, {size / 1e6:.1f} MB "
          "of JSON Lines")

    def fresh():
        return gigatoken.Tokenizer.from_tiktoken(str(tiktoken_file), pretokenizer="gpt4", special_tokens={})

    warm = fresh()
    rates, cpu_once = {}, None
    for threads, how in ((1, "encode"), (args.workers, "encode"), (args.workers, "encode_batch")):
        for label, make in (("warm", lambda: warm), ("once", fresh)):
            dt, n, cpu = best(lambda g, t=threads, h=how: bare(g, docs, t, h), args.repeat, make)
            key = f"{threads} thread{'s' * (threads > 1)} {how} {label}"
            rates[key] = n / dt
            cpu_once = n / cpu if key == "1 thread encode once" else cpu_once
            print(f"bare gigatoken, {key}: {n / dt / 1e6:7.2f} Mtok/s, {n / cpu / 1e6:7.2f} Mtok per CPU-second")
    # as a build pays it: the encoder made from the tokenizer file, then each document encoded once
    dt, n, cpu = best(lambda _: bare(fresh(), docs, 1, "encode"), args.repeat)
    rates["1 thread encode once, encoder made in the clock"] = n / dt
    print(f"bare gigatoken, 1 thread encode once, encoder made in the clock: {n / dt / 1e6:7.2f} Mtok/s")
    inputs = [("", folder)]
    if args.parquet:  # the same files as Parquet, row groups of --parquet rows (a task is a run of row groups)
        import pyarrow as pa
        import pyarrow.parquet as pq

        inputs.append((" (Parquet)", tmp / f"{name}-parquet"))
        inputs[-1][1].mkdir()
        for stem, texts in files.items():
            pq.write_table(pa.table({"text": texts}), inputs[-1][1] / f"{stem}.parquet", row_group_size=args.parquet)
    for what_in, src in inputs:
        for executor in ("inline", "processes"):
            runs = [build(tiktoken_file, src, tmp / f"c-{name}-{src.name}-{executor}-{i}", executor, args.workers)
                    for i in range(args.repeat)]
            wall, tokens, torch, work, _ = min(runs)
            cpu = min(r[4] for r in runs)
            label = f"build{what_in} --executor {executor:9s}"
            for what, dt in (("from its first task", work), ("whole process", wall)):
                ratios = ", ".join(f"{tokens / dt / r:.2f}x {k}" for k, r in rates.items())
                print(f"{label} {what}: {tokens / dt / 1e6:7.2f} Mtok/s ({dt:.2f} s); {ratios}")
            print(f"{label}: start-up before its first task {wall - work:.2f} s; torch imported: {torch}; "
                  f"{cpu:.2f} s of CPU (workers included), {tokens / cpu / 1e6:.2f} Mtok per CPU-second, "
                  f"{tokens / cpu / cpu_once:.2f}x bare one thread once")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpora", default="debian-docs,all-text", help="comma-separated; all-text-x4: 4 copies")
    ap.add_argument("--train-chars", type=int, default=3_000_000)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--reference-docs", type=int, default=800,
                    help="debian-docs documents the (slower) reference encoders encode")
    ap.add_argument("--skip-encoders", action="store_true", help="only step 2 and 3")
    ap.add_argument("--parquet", type=int, default=0, metavar="ROWS",
                    help="also build the same files written as Parquet, ROWS rows a row group (0: not)")
    args = ap.parse_args()

    import awkward  # noqa: F401 - gigatoken's encode_batch returns its arrays: imported before any clock
    import gigatoken  # noqa: F401 - the fast encoder must be installed for this bench

    docs = read_docs()
    print(f"debian-docs: {len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} M characters; "
          f"{os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-fast-") as tmp:
        tmp = Path(tmp)
        paths = train(docs, args.train_chars, args.vocab, tmp)
        if not args.skip_encoders:
            encoders(paths, docs, args)
        for name in args.corpora.split(","):
            builds(name, paths["tiktoken"], tmp, args)
    helps = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "niels_gpt", "build", "--help"], capture_output=True, check=True,
                       env=_env())
        helps.append(time.perf_counter() - t0)
    print(f"\nstart-up: `python -m niels_gpt build --help` {min(helps):.2f} s (best of 3)")


if __name__ == "__main__":
    main()
