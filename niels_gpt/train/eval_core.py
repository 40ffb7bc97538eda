"""The CORE evaluation (DCLM's, as nanochat runs it): in-context tasks scored by the base model's loss.

- task types: `multiple_choice` (one context, several continuations), `schema` (several contexts, one
  continuation), `language_modeling` (exact match of the continuation);
- prompts rendered from Jinja2 templates with `num_fewshot` examples (torch.Generator seeded 1234 + item);
- an item's sequences are right-padded into one batch and scored in one forward: the option with the lowest
  mean loss over its continuation wins; items are strided across ranks and the results all-reduced;
- accuracy is centred on the random baseline b%: (acc - b/100) / (1 - b/100); CORE is the mean over tasks.

A bundle (DCLM/nanochat's, or our items in niels_gpt/train/core_items/) holds core.yaml, eval_data/ and
eval_meta_data.csv; the full one downloads from CORE_BUNDLE_URL.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from niels_gpt.atomic import atomic_path
from niels_gpt.errors import ConfigError, SourceError

CORE_BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
BUNDLED_ITEMS = Path(__file__).with_name("core_items")
FEWSHOT_SEED = 1234

MC_TEMPLATE = """
{%- for example in fewshot_examples -%}
{{ example.query }}{{ continuation_delimiter }}{{ example.choices[example.gold] }}

{% endfor -%}
{{ item.query }}{{ continuation_delimiter }}{{ choice }}""".strip()

SCHEMA_TEMPLATE = """
{%- for example in fewshot_examples -%}
{{ example.context_options[example.gold] }}{{ continuation_delimiter }}{{ example.continuation }}

{% endfor -%}
{{ context }}{{ continuation_delimiter }}{{ item.continuation }}""".strip()

LM_TEMPLATE = """
{%- for example in fewshot_examples -%}
{{ example.context | trim }}{{ continuation_delimiter }}{{ example.continuation }}

{% endfor -%}
{{ item.context | trim }}{{ continuation_delimiter }}{% if include_continuation %}{{ item.continuation }}{% endif %}""".strip()


TEMPLATES = {"multiple_choice": MC_TEMPLATE, "schema": SCHEMA_TEMPLATE, "language_modeling": LM_TEMPLATE}
TASK_TYPES = tuple(TEMPLATES)


def render_prompts(item: dict, task_type: str, delimiter: str, fewshot: list[dict]) -> list[str]:
    """mc: one prompt per choice; schema: one per context option; LM: [without, with] the continuation."""
    if task_type not in TEMPLATES:
        raise ConfigError(f"task type {task_type!r}: expected one of {', '.join(TASK_TYPES)}")
    from jinja2 import Template  # lazy: jinja2 only when CORE runs

    t = Template(TEMPLATES[task_type])
    ctx = {"fewshot_examples": fewshot, "continuation_delimiter": delimiter, "item": item}
    if task_type == "multiple_choice":
        return [t.render(choice=c, **ctx) for c in item["choices"]]
    if task_type == "schema":
        return [t.render(context=c, **ctx) for c in item["context_options"]]
    return [t.render(include_continuation=False, **ctx).strip(), t.render(include_continuation=True, **ctx)]


def _common_prefix(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    return next((i for i in range(n) if any(s[i] != seqs[0][i] for s in seqs[1:])), n)


def batch_sequences(tokenizer, prompts: list[str], task_type: str) -> tuple[list[list[int]], list[int], list[int]]:
    """(token lists with BOS first, start and end of each scored continuation)."""
    bos = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eot_id
    tokens = [[bos] + tokenizer.encode(p) for p in prompts]
    if task_type == "multiple_choice":
        return tokens, [_common_prefix(tokens)] * len(tokens), [len(t) for t in tokens]
    if task_type == "schema":
        suffix = _common_prefix([t[::-1] for t in tokens])
        return tokens, [len(t) - suffix for t in tokens], [len(t) for t in tokens]
    # NOTE: a subword tokenizer may merge the prompt's last piece with the continuation; the scored
    # span starts where the two token lists first differ.
    return tokens[1:], [_common_prefix(tokens)], [len(tokens[1])]


def fewshot_for(data: list[dict], idx: int, k: int) -> list[dict]:
    if k == 0:
        return []
    if k >= len(data):
        raise ConfigError(f"{k}-shot needs more than {k} items; the task has {len(data)}")
    g = torch.Generator().manual_seed(FEWSHOT_SEED + idx)
    others = [i for i in range(len(data)) if i != idx]
    return [data[others[j]] for j in torch.randperm(len(others), generator=g)[:k].tolist()]


@torch.no_grad()
def evaluate_example(idx: int, model, tokenizer, data: list[dict], device, task: dict) -> bool:
    item, task_type = data[idx], task["icl_task_type"]
    prompts = render_prompts(item, task_type, task["continuation_delimiter"],
                             fewshot_for(data, idx, task["num_fewshot"]))
    tokens, starts, ends = batch_sequences(tokenizer, prompts, task_type)
    max_len = getattr(getattr(model, "config", None), "sequence_len", None)
    if max_len is not None:
        # keep the last max_len tokens: the continuation is at the end
        cut = [max(0, len(t) - max_len) for t in tokens]
        tokens = [t[c:] for t, c in zip(tokens, cut, strict=True)]
        starts = [s - c for s, c in zip(starts, cut, strict=True)]
        ends = [e - c for e, c in zip(ends, cut, strict=True)]
    rows = [torch.tensor(t) for t in tokens]
    input_ids = pad_sequence(rows, batch_first=True, padding_value=tokens[0][0]).to(device)
    logits = model(input_ids).float()
    if task_type == "language_modeling":
        s, e = starts[0], ends[0]
        return bool(torch.equal(logits.argmax(dim=-1)[0, s - 1:e - 1], input_ids[0, s:e]))
    # the loss of position j predicts token j + 1
    losses = F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")
    means = [losses[i, s - 1:e - 1].mean().item() for i, (s, e) in enumerate(zip(starts, ends, strict=True))]
    return min(range(len(means)), key=means.__getitem__) == item["gold"]


def evaluate_task(model, tokenizer, data: list[dict], device, task: dict) -> float:
    """Mean 0/1 correctness over the task's items, computed across all ranks."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    correct = torch.zeros(len(data), dtype=torch.float32, device=device)
    for idx in range(rank, len(data), world):
        correct[idx] = float(evaluate_example(idx, model, tokenizer, data, device, task))
    if world > 1:
        dist.all_reduce(correct, op=dist.ReduceOp.SUM)
    return correct.mean().item()


def centred(accuracy: float, random_baseline_percent: float) -> float:
    b = 0.01 * random_baseline_percent
    return (accuracy - b) / (1.0 - b)


def load_bundle(root: str | os.PathLike) -> list[dict]:
    """[{label, icl_task_type, num_fewshot, continuation_delimiter, random_baseline, data}] from a bundle dir."""
    import yaml

    root = Path(root)
    if (root / "eval_bundle").is_dir():
        root = root / "eval_bundle"
    cfg_path = root / "core.yaml"
    for name in ("core.yaml", "eval_meta_data.csv"):
        if not (root / name).is_file():
            raise SourceError(f"{root}: no {name}; a CORE bundle (--core) holds core.yaml, eval_data/ and "
                              "eval_meta_data.csv: give its directory, the bundle zip's http(s) URL, or 'bundled'")
    with open(root / "eval_meta_data.csv", encoding="utf-8") as f:
        baselines = {row["Eval Task"]: float(row["Random baseline"]) for row in csv.DictReader(f)}
    tasks = []
    for t in yaml.safe_load(cfg_path.read_text("utf-8"))["icl_tasks"]:
        label, task_type = t["label"], t["icl_task_type"]
        if task_type not in TASK_TYPES:
            raise SourceError(f"{cfg_path}: task {label!r} has icl_task_type {task_type!r}; "
                              f"expected one of {', '.join(TASK_TYPES)}")
        if label not in baselines:
            raise SourceError(f"{root}/eval_meta_data.csv: no random baseline for task {label!r}; add a row")
        path = root / "eval_data" / t["dataset_uri"]
        data = []
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if line.strip():
                try:
                    data.append(json.loads(line))
                except ValueError as exc:
                    raise SourceError(f"{path}:{n}: not a JSON object ({exc})") from exc
        tasks.append({"label": label, "icl_task_type": task_type, "num_fewshot": int(t["num_fewshot"][0]),
                      "continuation_delimiter": t.get("continuation_delimiter", " "),
                      "random_baseline": baselines[label], "data": data})
    return tasks


def download_core_bundle(dest: str | os.PathLike, url: str = CORE_BUNDLE_URL) -> Path:
    """Fetch and unpack the eval bundle zip into `dest` (once; a finished unpack is reused)."""
    import shutil
    import urllib.request

    dest = Path(dest)
    bundle = dest / "eval_bundle"
    if (bundle / "core.yaml").is_file():
        return bundle
    dest.mkdir(parents=True, exist_ok=True)
    zpath = dest / "eval_bundle.zip"
    with atomic_path(zpath) as tmp, urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as f:
        shutil.copyfileobj(resp, f)
    staging = dest / "eval_bundle.unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.unpack_archive(zpath, staging, "zip")
    inner = staging / "eval_bundle" if (staging / "eval_bundle").is_dir() else staging
    if not (inner / "core.yaml").is_file():
        raise SourceError(f"{url}: the zip holds no eval_bundle/core.yaml; is this the CORE eval bundle?")
    os.replace(inner, bundle)
    shutil.rmtree(staging, ignore_errors=True)
    return bundle


def run_core(model, tokenizer, where: str = "bundled", *, device="cpu", max_items: int | None = None,
             log=print) -> dict:
    """{"tasks": {label: {"accuracy", "centered"}}, "core": mean centred} over a bundle: "bundled" (our
    items), a bundle directory, or the zip's http(s) URL (downloaded into ~/.cache/niels_gpt/core)."""
    if where == "bundled":
        root = BUNDLED_ITEMS
    elif str(where).startswith(("http://", "https://")):
        root = download_core_bundle(Path.home() / ".cache" / "niels_gpt" / "core", where)
    else:
        root = Path(where)
    results = {}
    for task in load_bundle(root):
        data = task["data"][:max_items] if max_items else task["data"]
        acc = evaluate_task(model, tokenizer, data, device, task)
        results[task["label"]] = {"accuracy": acc, "centered": centred(acc, task["random_baseline"])}
        log(f"CORE {task['label']:<24} accuracy {acc:.4f} | centred {results[task['label']]['centered']:+.4f}")
    core = sum(r["centered"] for r in results.values()) / max(len(results), 1)
    log(f"CORE metric {core:+.4f} over {len(results)} task(s)")
    return {"tasks": results, "core": core}
