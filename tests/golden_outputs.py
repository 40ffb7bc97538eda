"""Every kind of output the library writes, and batches from every reader, reduced to sha256 digests.

`python tests/golden_outputs.py OUT.json` records them; tests/test_golden_outputs.py rebuilds them and
compares with tests/golden/outputs.json. Moving code between modules must not change one byte of any
cache, converted file or packed bin, nor one token of any batch: this is the check that says so.
Only the contract's import paths and long-standing public ones are used, so the same script runs on
any version of the package.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

from niels_gpt.cache.cli import main as cli
from niels_gpt.cache.pretrain_dataset import PretrainTokenStreamDataset
from niels_gpt.cache.sft_dataset import SFTExampleDataset
from niels_gpt.formats.kempner_dataset import MemoryMappedDataset
from niels_gpt.formats.nanogpt_dataset import NanogptDataset
from niels_gpt.loading import IndexedWindowDataset
from niels_gpt.packing import open_packed

CONVERSIONS = ("niels", "nanogpt", "nanogpt-legacy", "kempner-npy", "raw", "megatron")
def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SEAL = re.compile(rb'"record_sha256": "[0-9a-f]{64}"')


def _tree(root: Path, work: Path) -> dict[str, str]:
    """Digest of each file below root; the work directory's name, which a manifest records as provenance,
    reads as <work>, and a record's own checksum (which covers that name) as <seal>: the digest of the
    rest of the record holds what it covers."""
    return {p.relative_to(root).as_posix(): _digest(SEAL.sub(b'"record_sha256": "<seal>"', p.read_bytes().replace(
        str(work).encode(), b"<work>"))) for p in sorted(root.rglob("*")) if p.is_file()}


def _tensor_digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _items(ds, n: int) -> str:
    out = []
    for i in range(min(n, len(ds))):
        item = ds[i]
        out.extend(item[k] for k in sorted(item)) if isinstance(item, dict) else out.extend(item)
    return _tensor_digest(*out)


def _stream(ds, n: int) -> str:
    out = []
    for i, item in enumerate(ds):
        if i == n:
            break
        out.extend(item[k] for k in sorted(item))
    return _tensor_digest(*out)


def _run(args: list[str]) -> None:
    if cli(args) != 0:
        raise SystemExit(f"failed: {' '.join(args)}")


def outputs(work: Path) -> dict[str, str]:
    """{what: sha256} for the sample caches, every conversion, a packed directory and reader batches."""
    cache = work / "cache"
    # the tokenizer on every sample source (train-tokenizer without SRC is build-all's tokenizer step), then three
    # caches: `build-all --only tokenizer NAME...` would train the tokenizer on those three sources alone
    _run(["train-tokenizer", "--cache-dir", str(cache), "--sample", "--no-progress"])
    _run(["build-all", "--cache-dir", str(cache), "--sample", "--no-progress", "--only", "wikitext", "roam", "dolly15k"])
    out = {f"cache/{k}": v for k, v in _tree(cache, work).items()}
    wikitext = cache / "pretrain" / "wikitext"
    for to in CONVERSIONS:
        dst = work / "converted" / to
        _run(["convert", str(wikitext), str(dst), "--to", to, "--shard-bytes", "4096"]
             + (["--not-for-kempnerforge"] if to == "raw" else []))
        out.update({f"converted/{to}/{k}": v for k, v in _tree(dst, work).items()})
    for algorithm in ("bfd", "first_fit_shuffle"):
        dst = work / "packed" / algorithm
        _run(["pack-sft", str(cache / "sft" / "dolly15k"), str(dst), "--seq-len", "256", "--algorithm", algorithm,
              "--seed", "0"])  # the seed these digests were first taken with (the default is 42)
        out.update({f"packed/{algorithm}/{k}": v for k, v in _tree(dst, work).items()})

    g = torch.Generator().manual_seed(7)
    pre = PretrainTokenStreamDataset(str(wikitext / "train"), T=32, device="cpu")
    out["batch/pretrain_stream"] = _tensor_digest(*(t for _ in range(3) for t in pre.get_batch(B=4, generator=g)))
    sft_dir = cache / "sft" / "dolly15k"
    eot = json.loads((sft_dir / "meta.json").read_text())["special_token_ids"]["eot"]
    sft = SFTExampleDataset(str(sft_dir / "train_tokens.bin"), str(sft_dir / "train_idx.npy"), T=64, device="cpu",
                            eot_id=eot)
    g = torch.Generator().manual_seed(7)
    out["batch/sft"] = _tensor_digest(*(t for _ in range(3) for t in sft.get_batch(B=4, generator=g)))
    out["batch/indexed_windows"] = _items(IndexedWindowDataset(str(wikitext), 32, split="train"), 16)
    out["batch/kempner_memmap"] = _items(MemoryMappedDataset(str(wikitext / "train"), seq_len=32,
                                                             pack_sequences=True), 16)
    nanogpt = sorted(str(p) for p in (work / "converted" / "nanogpt").rglob("*.bin"))
    out["batch/nanogpt_stream"] = _stream(NanogptDataset(nanogpt, 32), 16)
    out["batch/packed_bfd"] = _items(open_packed(str(work / "packed" / "bfd")), 8)
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = outputs(Path(tmp))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} digests -> {sys.argv[1]}")
