"""A reduced, seeded run of the train campaign (bench/campaign_train.py; the full run's figures are in
docs/training.md): runs killed (SIGKILL) or interrupted (SIGINT) at random moments never leave a checkpoint that
does not verify, resume to the straight run's losses and final state bit for bit, and leave no temporaries and no
lock that blocks the rerun; corrupted checkpoints are refused, never trained on."""

import importlib.util
from pathlib import Path

import pytest

from ..conftest import ctrl_c_delivered

BENCH = Path(__file__).resolve().parents[2] / "bench" / "campaign_train.py"


@pytest.fixture(scope="module")
def figures(tmp_path_factory, pretrain_cache):
    spec = importlib.util.spec_from_file_location("campaign_train", BENCH)
    campaign = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(campaign)
    with ctrl_c_delivered():  # its SIGINT runs stop even in a suite run with SIGINT ignored (a background job)
        result = campaign.run_train_campaign(tmp_path_factory.mktemp("campaign-train"), kills=2, flips=24, seed=5,
                                             cache=pretrain_cache, steps=20, save_every=6,
                                             # inside the loop, its handler installed (what the test is for),
                                             # and steps before its end, so a loaded machine that reads the log
                                             # late still finds the run going (step 18 of 20 once did not)
                                             first=2, last=12)
    campaign.report(result)
    return result


def test_killed_runs_resume_to_the_straight_run_and_leave_nothing(figures):
    t = figures["kill_totals"]
    assert t["kills"] == t["reruns"] == 2 and [r["signal"] for r in figures["kills"]] == ["SIGKILL", "SIGINT"]
    assert t.get("complete-looking partial", 0) == 0
    assert t.get("rerun failed", 0) == 0
    assert t.get("losses differ from the straight run", 0) == 0
    assert t.get("final state differs from the straight run", 0) == 0
    assert t.get("leftovers after rerun", 0) == 0
    # a SIGKILL that found the lock held leaves it (its holder dead, the rerun takes it over); a SIGINT never does
    assert t["lock left by the kill"] == t.get("SIGKILL with the lock held", 0)
    assert t.get("rerun refused by a stale lock", 0) == 0 and t.get("lock left after the rerun", 0) == 0
    assert t["SIGKILL while running"] == t["SIGINT while running"] == 1
    assert t["SIGINT: exit 130 with one line"] == t["SIGINT: the step saved"] == 1


def test_corrupted_checkpoints_are_refused_never_trained_on(figures):
    c = figures["corruption"]
    assert c["changes"] >= 24 and c["refused on load"] >= 20
    assert c.get("silently different", 0) == 0 and c.get("crashed (not a package error)", 0) == 0
    assert c["train --resume refused it in one line"] == 2 and c.get("train --resume wrote something", 0) == 0
