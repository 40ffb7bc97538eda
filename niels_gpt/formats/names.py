"""The names `convert --to` takes: each format by its own name and by the name of the program that reads
it, with that program, for `convert --help`, the docs and `convert(to=...)`.

`nanogpt` is NeMo AutoModel's header (magic 278895051), which neither nanoGPT nor modded-nanogpt reads;
modded-nanogpt reads `nanogpt-legacy` (magic 20240520), and nanoGPT's own train.py reads headerless uint16
`train.bin`/`val.bin` files, which is `raw`. The aliases say so where a user looks for the program.
"""

from __future__ import annotations

from niels_gpt.formats.detect import FORMATS

ALIASES = {"automodel": "nanogpt", "modded-nanogpt": "nanogpt-legacy", "nanogpt-train-bin": "raw"}
READERS = {
    "niels": "this library (PretrainTokenStreamDataset, open_dataset, every reader here)",
    "nanogpt": "NeMo AutoModel's NanogptDataset (header magic 278895051, .bos.idx sidecars)",
    "nanogpt-legacy": "modded-nanogpt's train_gpt.py (header magic 20240520, uint16)",
    "kempner-npy": "KempnerForge's MemoryMappedDataset (.npy shards + metadata.yaml)",
    "raw": "nanoGPT's train.py (np.memmap uint16 train.bin/val.bin); any reader told the dtype",
    "megatron": "Megatron-LM's IndexedDataset (--data-path PREFIX)",
}
NAMES = (*FORMATS, *ALIASES)


def canonical_format(name: str) -> str:
    """The format an alias names (`automodel` -> `nanogpt`); a format's own name is itself."""
    return ALIASES.get(name, name)


def formats_help() -> str:
    """One line per format: its name, its aliases, and the program that reads it."""
    lines = ["formats (--to) and the programs that read them:"]
    for fmt in FORMATS:
        aliases = [a for a, f in ALIASES.items() if f == fmt]
        name = fmt + (f" (= {', '.join(aliases)})" if aliases else "")
        lines.append(f"  {name:<34} {READERS[fmt]}")
    return "\n".join(lines)
