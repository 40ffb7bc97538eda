"""The names `convert --to` takes: each format by its own name and by the program that reads it.

`nanogpt` is NeMo AutoModel's header (magic 278895051), which neither nanoGPT nor modded-nanogpt reads;
modded-nanogpt reads `nanogpt-legacy` (magic 20240520); nanoGPT's train.py reads headerless uint16
`train.bin`/`val.bin`, i.e. `raw` written as one file per split. An alias writes exactly its format; a preset
is a format plus fixed settings (`nanogpt-train-bin`), applied by `convert` itself.
"""

from __future__ import annotations

from niels_gpt.formats.detect import FORMATS

READERS = {
    "niels": "this library (PretrainTokenStreamDataset, open_dataset, every reader here)",
    "nanogpt": "NeMo AutoModel's NanogptDataset (header magic 278895051, .bos.idx sidecars)",
    "nanogpt-legacy": "modded-nanogpt's train_gpt.py (header magic 20240520, uint16)",
    "kempner-npy": "KempnerForge's MemoryMappedDataset (.npy shards + metadata.yaml)",
    "raw": "any reader told the dtype (np.memmap(path, dtype=...)); metadata.yaml records it",
    "megatron": "Megatron-LM's IndexedDataset (--data-path PREFIX)",
}
# name -> (format, what the preset fixes, the program it is named after). An alias fixes nothing.
TABLE = {
    **{fmt: (fmt, None, None) for fmt in FORMATS},
    "automodel": ("nanogpt", None, "NeMo AutoModel"),
    "modded-nanogpt": ("nanogpt-legacy", None, "modded-nanogpt"),
    "nanogpt-train-bin": ("raw", "one uint16 file per split", "nanoGPT's train.py (train.bin/val.bin)"),
}
ALIASES = {name: fmt for name, (fmt, fixes, _) in TABLE.items() if name != fmt and fixes is None}
PRESETS = {name: fmt for name, (fmt, fixes, _) in TABLE.items() if fixes is not None}
NAMES = tuple(TABLE)
ONE_FILE = 2**62  # tokens per file of a preset that writes one file per split


def canonical_format(name: str) -> str:
    """The format a name writes (`automodel` -> `nanogpt`, `nanogpt-train-bin` -> `raw`)."""
    return TABLE[name][0] if name in TABLE else name


def reader_of(name: str) -> str:
    """The program that reads what `name` writes."""
    fmt, fixes, program = TABLE.get(name, (name, None, None))
    return program if fixes is not None else READERS[fmt]


def formats_help() -> str:
    """One line per format: its name, its aliases, and the program that reads it; then the presets."""
    lines = ["formats (--to) and the programs that read them (a format named after its reader first):"]
    for fmt in FORMATS:
        aliases = [a for a, f in ALIASES.items() if f == fmt]
        name = f"{aliases[0]} (= {', '.join([fmt, *aliases[1:]])})" if aliases else fmt
        lines.append(f"  {name:<34} {READERS[fmt]}")
    for name, fmt in PRESETS.items():
        _, fixes, program = TABLE[name]
        lines.append(f"  {name:<34} {fmt}, {fixes}: {program}")
    return "\n".join(lines)
