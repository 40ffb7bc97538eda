"""verify: check every output through the readers training uses.

Each meta.json is schema-checked and each file it lists compared with the disk (size, token count, sha256, SFT
offsets); packed bins are validated by the packing reader; a converted output is opened by its format's reader
and its ids checked against the recorded vocabulary; token files without their record are an unfinished build.
A cache whose records hold is then opened by the readers' own open-time code, so what verify passes opens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from niels_gpt.constants import EXAMPLES_NAME, MANIFEST_NAME, MODEL_NAME, SPLITS
from niels_gpt.errors import FormatError, NielsGPTError
from niels_gpt.formats.receipt import check_receipt, receipt_path
from niels_gpt.formats.zstd_shard import frame_tokens_of, is_compressed_meta, verify_compressed
from niels_gpt.locate import locate
from niels_gpt.markers import packed_files, present, read_json, unfinished_message
from niels_gpt.meta import (
    META_NAME,
    check_files,
    disk_problem,
    meta_seal_problem,
    read_meta,
    record_problem,
    sft_offsets_problem,
    sha256_file,
)
from niels_gpt.packing import PackedMemmapDataset, open_packed
from niels_gpt.packing.memmap_format import FORMAT_NAME
from niels_gpt.readers.sft_examples import SFTExamples
from niels_gpt.readers.shards import split_shards
from niels_gpt.report.found import find_caches, find_tokenizer, interrupted_builds, unfinished_dirs
from niels_gpt.seals import RECORD_SEAL, is_sealed


def _check_special_ids(cache: Path, meta: dict) -> list[str]:
    """The special ids meta.json records must be those of the tokenizer it names (when that tokenizer is found)."""
    try:
        tok = find_tokenizer(cache, meta)
    except NielsGPTError:
        return []  # no tokenizer with the recorded sha256 near the cache: nothing to compare with
    theirs = {k: v for k, v in tok.special_ids.items() if k in meta["special_token_ids"]}
    ours = {k: meta["special_token_ids"][k] for k in theirs}
    if ours != theirs:
        return [f"{cache / META_NAME}: special_token_ids {ours} but the tokenizer it was built with has {theirs}; "
                "the meta.json was edited or damaged: rebuild the cache"]
    return []


def _stray_files(directory: Path, listed: set[str], marker: str = META_NAME) -> list[str]:
    """Files inside an output that its metadata does not list: temporaries of a killed run, leftovers."""
    stray = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_dir() or rel == marker or rel in listed:
            continue
        if any((directory / parent / META_NAME).is_file() for parent in Path(rel).parents if str(parent) != "."):
            continue  # a nested output of its own, checked on its own
        stray.append(f"{p}: a file the {marker} does not list (a temporary of a killed run or a leftover); "
                     "remove it or rebuild")
    return stray


def _check_tokenizer(directory: Path, meta: dict) -> list[str]:
    model = directory / str(meta.get("model_file", MODEL_NAME))
    if not model.is_file():
        return [f"{model}: missing (its meta.json records the model's sha256)"]
    digest = sha256_file(str(model))
    if digest != meta["tokenizer_sha256"]:
        return [f"{model}: sha256 {digest[:16]}… differs from meta {str(meta['tokenizer_sha256'])[:16]}…: the model "
                "changed after training; every cache built with it names the recorded sha256"]
    return []


def verify_path(path: str) -> tuple[list[str], int]:
    """(problems, outputs checked) for a cache, a root of caches, a packed directory or a converted output."""
    return verify_outputs(path)[:2]


def verify_outputs(path: str) -> tuple[list[str], int, list[str]]:
    """verify_path, plus one line per output checked naming what it is."""
    root = Path(path)
    if not present(root):
        return interrupted_builds(root) or [f"{root}: no such file or directory"], 0, []
    try:
        found, refused = locate(root), None  # the one door; what it refuses is said below
    except NielsGPTError as exc:
        found, refused = None, exc
    if found is not None and found.split is not None:  # a split directory: checked as the cache it is part of
        return verify_outputs(str(found.root))
    caches = find_caches(root) if root.exists() else []
    # packed bins (pack-sft's packed val split in val/ is a shard of its own)
    packed = sorted(p.parent for p in root.rglob(MANIFEST_NAME)) if root.is_dir() else []
    if not caches and not packed:
        if refused is not None and root.is_dir() and receipt_path(root).is_file():  # a refused convert output
            return [str(refused.__cause__ or refused), *check_receipt(receipt_path(root))[1]], 1, []
        if found is not None and found.kind == "foreign":
            return _verify_foreign(root, found.info)
        if found is not None and found.layout == "parquet":
            return _verify_packed_parquet(root)
    problems = [unfinished_message(d) for d in unfinished_dirs(root)] + interrupted_builds(root)
    seen = []
    for shard in packed:
        seen.append(f"{shard}: packed SFT bins ({FORMAT_NAME})" + _unsealed_note(shard / MANIFEST_NAME))
        try:
            ds = PackedMemmapDataset(shard)  # its manifest's seal is checked on open
            ds.validate()
            listed = packed_files(shard) or set()
            examples = ds.manifest.get("examples")  # pack-sft's examples.npy, checked as the manifest records it
            if EXAMPLES_NAME in listed and record_problem(examples) is None:
                problems += [p for p in [disk_problem(shard / EXAMPLES_NAME, examples, MANIFEST_NAME)] if p]
            elif EXAMPLES_NAME in listed:
                listed.discard(EXAMPLES_NAME)  # a damaged record: the file is named a stray below
            problems += _stray_files(shard, listed, MANIFEST_NAME)
        except NielsGPTError as exc:
            problems.append(str(exc))
    for cache in caches:
        try:
            meta = read_meta(str(cache), check_seal=False)  # the seal last, below
        except NielsGPTError as exc:
            problems.append(str(exc))
            continue
        seen.append(f"{cache}: {meta['kind']} cache" + _unsealed_note(cache / META_NAME))
        wrong = _check_cache(cache, meta)
        # a broken seal is reported where nothing more specific names what changed (a field no reader uses)
        seal = meta_seal_problem(cache / META_NAME, (cache / META_NAME).read_bytes(), meta)
        problems += wrong or ([seal] if seal else [])
    if not caches and not packed and not problems:
        problems.append(f"{root}: no {META_NAME}, {MANIFEST_NAME} or token files of a known format found: "
                        "not a cache, a packed directory or a converted output")
    return problems, len(caches) + len(packed), seen


def _check_cache(cache: Path, meta: dict) -> list[str]:
    """Every file a cache's (or tokenizer's) meta.json lists against the disk, and nothing unlisted."""
    if meta["kind"] == "tokenizer":
        return _check_tokenizer(cache, meta) + _stray_files(cache, {str(meta.get("model_file", MODEL_NAME))})
    if meta.get("built") is False:
        return []
    found = check_files(cache, meta, hashes=True)
    named = {line.split(": ", 1)[0] for line in found}
    found += [line for line in _check_counts(cache, meta) if line.split(": ", 1)[0] not in named]
    found += (_check_special_ids(cache, meta) + _stray_files(cache, set(meta["files"]))
              + verify_compressed(cache, meta))  # a compressed cache: every frame decompressed against its index
    return found or _open_problems(cache, meta)


def _open_problems(cache: Path, meta: dict) -> list[str]:
    """What a reader refuses on open though every file matches its record (a meta.json edited and resealed);
    run only when nothing more specific was found."""
    if any(rel.endswith(".bin.zst") for rel in meta["files"]) and not is_compressed_meta(meta):
        return [f"{cache / META_NAME}: lists compressed shards (.bin.zst) but has no `compression` entry, so no "
                "reader opens them; the meta.json was edited: rebuild or convert the cache again"]
    try:
        if is_compressed_meta(meta):
            frame_tokens_of(meta, cache / META_NAME)
        if meta["kind"] == "pretrain":
            for split in sorted({rel.split("/", 1)[0] for rel in meta["files"] if "/" in rel}):
                split_shards(cache, meta, split)
        elif meta["kind"] == "sft":
            eot = meta["special_token_ids"]["eot"]
            if not isinstance(eot, int):
                return [f"{cache / META_NAME}: special_token_ids.eot is {eot!r}; an SFT reader pads with the EOT id: "
                        "rebuild the cache"]
            for split in SPLITS:
                idx = meta["files"].get(f"{split}_idx.npy")
                if idx and idx.get("examples", 1):
                    SFTExamples(str(cache / f"{split}_tokens.bin"), str(cache / f"{split}_idx.npy"), T=1, eot_id=eot)
    except NielsGPTError as exc:
        return [str(exc)]
    return []


def _unsealed_note(record_path: Path) -> str:
    """What verify says of a record written before records carried their own checksum."""
    try:
        record = read_json(record_path)
    except FormatError:
        return ""  # unreadable: its reader's error says so
    if record is None or is_sealed(record):
        return ""
    return (f" (its {record_path.name} has no {RECORD_SEAL}: written by an older version, so fields no reader "
            "uses are not checked; rebuild it to add one)")


def _verify_foreign(root: Path, info) -> tuple[list[str], int, list[str]]:
    """A converted output (headers and sizes checked by detect_format): every id against the recorded
    vocabulary."""
    problems = []
    leaves = list(info.splits.values()) if info.splits else [info]
    for leaf in leaves:
        for tf in leaf.token_files if leaf.vocab_size is not None else []:
            top = int(tf.open().max()) if tf.count else -1
            if top >= leaf.vocab_size:
                problems.append(f"{tf.path}: token id {top} >= vocab_size {leaf.vocab_size} recorded in its "
                                "metadata: the file or its metadata is corrupt; re-run convert")
    kind = f"{info.format} ({info.dtype.name}, {info.num_tokens:,} tokens in {len(info.files)} file(s))"
    note = "" if any(leaf.vocab_size for leaf in leaves) else "; no vocab_size recorded, ids not range-checked"
    receipt = receipt_path(root)
    if root.exists() and receipt.is_file():
        problems += check_receipt(receipt)[1]
        note += f"; every file's sha256 checked against {receipt.name}" + _unsealed_note(receipt)
    else:
        note += "; no receipt (not written by convert): no checksums to compare"
    return problems, 1, [f"{root}: {kind}: headers and sizes checked{note}"]


def _verify_packed_parquet(root: Path) -> tuple[list[str], int, list[str]]:
    try:
        ds = open_packed(root)
        for i in range(len(ds)):
            ds[i]
    except NielsGPTError as exc:
        return [str(exc)], 1, []
    return [], 1, [f"{root}: packed SFT Parquet, {len(ds):,} bins read"]


def _check_counts(cache: Path, meta: dict) -> list[str]:
    """The SFT offsets of well-sized files against meta.json (a file check_files reported is skipped)."""
    out = []
    for rel, rec in sorted(meta["files"].items()):
        path = cache / rel
        if (not rel.endswith("_idx.npy") or record_problem(rec) is not None or not path.is_file()
                or path.stat().st_size != rec["bytes"]):
            continue
        try:
            idx = np.load(path, allow_pickle=False)
        except Exception as exc:  # numpy raises ValueError, SyntaxError or TokenError on a damaged header
            out.append(f"{path}: unreadable offsets ({type(exc).__name__}: {exc})")
            continue
        if len(idx) != rec.get("examples", len(idx)):
            out.append(f"{path}: {len(idx)} offsets, meta says {rec['examples']} examples")
        tokens = meta["files"].get(rel.replace("_idx.npy", "_tokens.bin"), {}).get("tokens")
        problem = sft_offsets_problem(idx, tokens)
        if problem is not None:
            out.append(f"{path}: {problem}")
    return out
