"""CORE on the bundled items equals a hand computation; bundles load from a directory or a zip over HTTP."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import zipfile

import pytest
import torch
import torch.nn.functional as F

from niels_gpt.errors import SourceError
from niels_gpt.train.eval_core import (
    BUNDLED_ITEMS,
    centred,
    download_core_bundle,
    evaluate_task,
    load_bundle,
    render_prompts,
    run_core,
)
from niels_gpt.train.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def model(tokenizer):
    m = GPT(GPTConfig(sequence_len=256, vocab_size=len(tokenizer), n_layer=1, n_head=2, n_kv_head=2, n_embd=32))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m.eval()


def fewshot(data, idx, k):
    """The documented rule: randperm of the other items from torch.Generator(1234 + idx), first k."""
    others = [i for i in range(len(data)) if i != idx]
    perm = torch.randperm(len(others), generator=torch.Generator().manual_seed(1234 + idx)).tolist()
    return [data[others[j]] for j in perm[:k]]


def hand_prompts(item, task, shots):
    d = task["continuation_delimiter"]
    if task["icl_task_type"] == "multiple_choice":
        head = "".join(f"{e['query']}{d}{e['choices'][e['gold']]}\n\n" for e in shots)
        return [f"{head}{item['query']}{d}{c}" for c in item["choices"]]
    if task["icl_task_type"] == "schema":
        head = "".join(f"{e['context_options'][e['gold']]}{d}{e['continuation']}\n\n" for e in shots)
        return [f"{head}{c}{d}{item['continuation']}" for c in item["context_options"]]
    head = "".join(f"{e['context'].strip()}{d}{e['continuation']}\n\n" for e in shots)
    return [f"{head}{item['context'].strip()}{d}".strip(), f"{head}{item['context'].strip()}{d}{item['continuation']}"]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def hand_correct(model, tok, item, task, shots) -> bool:
    """One sequence at a time, no padding: mean loss over each option's own continuation tokens."""
    seqs = [[tok.bos_id] + tok.encode(p) for p in hand_prompts(item, task, shots)]
    if task["icl_task_type"] == "language_modeling":
        without, full = seqs
        s = first_difference(without, full)
        logits = model(torch.tensor([full]))[0]
        return logits[s - 1:len(full) - 1].argmax(-1).tolist() == full[s:]
    if task["icl_task_type"] == "multiple_choice":
        start = min(first_difference(seqs[0], s) for s in seqs[1:])
        spans = [(start, len(s)) for s in seqs]
    else:
        suffix = min(first_difference(seqs[0][::-1], s[::-1]) for s in seqs[1:])
        spans = [(len(s) - suffix, len(s)) for s in seqs]
    losses = []
    for s, (a, b) in zip(seqs, spans, strict=True):
        logits = model(torch.tensor([s]))[0]
        losses.append(F.cross_entropy(logits[a - 1:b - 1], torch.tensor(s[a:b])).item())
    return losses.index(min(losses)) == item["gold"]


def test_bundled_items_score_as_the_hand_computation(model, tokenizer):
    tasks = load_bundle(BUNDLED_ITEMS)
    assert [t["icl_task_type"] for t in tasks] == ["multiple_choice", "schema", "language_modeling"]
    assert sum(len(t["data"]) for t in tasks) == 40
    results = run_core(model, tokenizer, "bundled", log=lambda *a: None)
    for task in tasks:
        data = task["data"]
        for idx in (0, len(data) - 1):  # the Jinja templates render what the plain strings say
            shots = fewshot(data, idx, task["num_fewshot"])
            assert render_prompts(data[idx], task["icl_task_type"], task["continuation_delimiter"], shots) == \
                hand_prompts(data[idx], task, shots)
        hand = [hand_correct(model, tokenizer, data[i], task, fewshot(data, i, task["num_fewshot"]))
                for i in range(len(data))]
        acc = sum(hand) / len(hand)
        got = results["tasks"][task["label"]]
        assert got["accuracy"] == pytest.approx(acc, abs=1e-7)
        assert got["centered"] == pytest.approx((acc - task["random_baseline"] / 100) / (1 - task["random_baseline"] / 100))
    assert results["core"] == pytest.approx(sum(r["centered"] for r in results["tasks"].values()) / 3)
    accs = [r["accuracy"] for r in results["tasks"].values()]
    assert 0 < accs[0] < 1 and 0 < accs[1] < 1  # a random model gets some right and some wrong


def test_centring_on_the_random_baseline():
    assert centred(0.25, 25) == 0.0 and centred(1.0, 25) == 1.0 and centred(0.625, 25) == pytest.approx(0.5)
    assert centred(0.3, 0) == pytest.approx(0.3)


def test_a_perfect_scorer_gets_every_item(tokenizer):
    """A model that always predicts the true next token matches every LM continuation exactly."""
    task = load_bundle(BUNDLED_ITEMS)[2]  # language modelling: exact match

    class Oracle(torch.nn.Module):
        def forward(self, ids):
            nxt = torch.roll(ids, -1, dims=1)
            return F.one_hot(nxt, len(tokenizer)).float() * 50

    assert evaluate_task(Oracle(), tokenizer, task["data"], "cpu", task) == 1.0


def copy_bundle(dst):
    shutil.copytree(BUNDLED_ITEMS, dst)
    return dst


@pytest.mark.parametrize("edit,match", [
    (lambda d: (d / "core.yaml").unlink(), "no core.yaml"),
    (lambda d: (d / "eval_meta_data.csv").unlink(), "no eval_meta_data.csv"),
    (lambda d: (d / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nwho_is_meant,50\n"), "no random baseline"),
    (lambda d: (d / "core.yaml").write_text((d / "core.yaml").read_text().replace("icl_task_type: schema", "icl_task_type: ranking")), "icl_task_type 'ranking'"),
    (lambda d: (d / "eval_data" / "who_is_meant.jsonl").write_text('{"gold": 0}\n{oops\n'), r"who_is_meant.jsonl:2: not a JSON"),
])
def test_bad_bundles_are_refused(tmp_path, edit, match):
    d = copy_bundle(tmp_path / "bundle")
    edit(d)
    with pytest.raises(SourceError, match=match):
        load_bundle(d)


@pytest.fixture
def http_dir(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_bundle_downloads_from_its_zip_over_http(tmp_path, http_dir):
    root, url = http_dir
    with zipfile.ZipFile(root / "eval_bundle.zip", "w") as z:
        for p in sorted(BUNDLED_ITEMS.rglob("*")):
            if p.is_file():
                z.write(p, "eval_bundle/" + str(p.relative_to(BUNDLED_ITEMS)))
        z.writestr("eval_bundle/extra.json", json.dumps({"note": "ignored"}))
    where = download_core_bundle(tmp_path / "cache", f"{url}/eval_bundle.zip")
    assert [t["label"] for t in load_bundle(where)] == [t["label"] for t in load_bundle(BUNDLED_ITEMS)]
    assert download_core_bundle(tmp_path / "cache", f"{url}/missing.zip") == where  # unpacked once, reused
    with zipfile.ZipFile(root / "other.zip", "w") as z:
        z.writestr("readme.txt", "not a bundle")
    with pytest.raises(SourceError, match="holds no eval_bundle/core.yaml"):
        download_core_bundle(tmp_path / "other", f"{url}/other.zip")
    assert not (tmp_path / "other" / "eval_bundle").exists()
