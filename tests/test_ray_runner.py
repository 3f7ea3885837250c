"""Ray scale-out: shards over actors on a local Ray instance (2 CPUs), findings and example
databases merged, and an actor killed mid-run whose shard is re-queued and completed."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from bi_props.campaigns.campaign import finding_from_dict
from bi_props.campaigns.ray_runner import (
    RayCampaign,
    ShardActor,
    actor_options,
    db_entries,
    db_union,
    default_actors,
    device_for,
)
from bi_props.model.space import load
from test_campaign import BUG_SIGNATURES, PLANTED, PLANTED_SOURCE, STRATEGIES, _lines


def test_actor_resources_follow_the_target() -> None:
    assert device_for("vllm") == "cuda" and device_for("ascend") == "npu"
    assert device_for("cpu") == "cpu" and device_for("my.lib") == "cpu"
    assert device_for("my.lib", "cuda") == "cuda"
    assert actor_options("cuda") == {"num_gpus": 1, "num_cpus": 1}
    assert actor_options("npu") == {"resources": {"NPU": 1}, "num_cpus": 1}
    assert actor_options("cpu") == {"num_cpus": 1}
    cluster = {"CPU": 16.0, "GPU": 8.0, "NPU": 4.0}
    assert default_actors("cuda", 1, cluster) == 8
    assert default_actors("npu", 2, cluster) == 2
    assert default_actors("cpu", 3, cluster) == 5
    assert default_actors("cuda", 1, {"CPU": 2.0}) == 1


def test_database_union_is_content_addressed_and_idempotent(tmp_path: Path) -> None:
    from hypothesis.database import DirectoryBasedExampleDatabase

    a, b = tmp_path / "a", tmp_path / "b"
    DirectoryBasedExampleDatabase(str(a)).save(b"cell-1", b"failure-1")
    db_b = DirectoryBasedExampleDatabase(str(b))
    db_b.save(b"cell-1", b"failure-2")
    db_b.save(b"cell-2", b"failure-3")
    entries = db_entries(b)
    assert db_union(a, entries) == len(entries) - 1  # the key index entry of cell-1 is shared
    assert db_union(a, entries) == 0
    merged = DirectoryBasedExampleDatabase(str(a))
    assert set(merged.fetch(b"cell-1")) == {b"failure-1", b"failure-2"}
    assert set(merged.fetch(b"cell-2")) == {b"failure-3"}
    assert db_entries(a, skip=set(db_entries(a))) == {}
    # Names that are not database entries are never written (nothing outside the directory).
    assert db_union(a, {"../evil/x": b"", "k/../../y": b"", ".hidden/z": b"", "flat": b""}) == 0
    assert not (tmp_path / "evil").exists()


def test_actors_give_their_workers_the_drivers_thread_settings(monkeypatch, tmp_path) -> None:
    from bi_props.runner.controller import Worker

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in an actor with one CPU
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    actor = ShardActor(
        "cpu", space, {}, environment={"OMP_NUM_THREADS": None, "MKL_NUM_THREADS": "2"}
    )
    try:
        env = Worker("cpu", "enabled").environment()
        assert "OMP_NUM_THREADS" not in env
        assert env["MKL_NUM_THREADS"] == "2"
    finally:
        actor.close()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray = pytest.importorskip("ray")
    root = tmp_path_factory.mktemp("planted-ray")
    (root / f"{PLANTED}.py").write_text(PLANTED_SOURCE)
    (root / "campaign.toml").write_text(STRATEGIES)
    saved = os.environ.get("PYTHONPATH")
    # The actors (and their workers) inherit the environment of the instance started here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), saved]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield {"ray": ray, "strategies": root / "campaign.toml"}
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.mark.campaign
@pytest.mark.slow
def test_ray_campaign_survives_a_killed_actor(local_ray, tmp_path: Path) -> None:
    ray = local_ray["ray"]
    space = load(local_ray["strategies"])
    out = tmp_path / "out"
    killed: list[tuple[int, int]] = []
    cell_shards: list[int] = []

    def kill_once(campaign, slot, shard) -> None:
        """Kill the actor that was just handed the third cell shard (it dies mid-shard)."""
        if shard.kind != "cell":
            return
        cell_shards.append(shard.id)
        if len(cell_shards) == 3:
            killed.append((shard.id, slot.index))
            ray.kill(slot.actor)

    log = io.StringIO()
    # Bounded by evidence (every cell 60 examples or retired), the 120 s only a cap: the same
    # shards run on a loaded machine, more slowly.
    campaign = RayCampaign(
        [PLANTED], space, out, 120, seed=5, actors=2, log=log, on_dispatch=kill_once,
        examples_per_cell=60,
    )  # fmt: skip
    status = campaign.run()
    text = log.getvalue()
    assert status == 1, text[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert "--examples-per-cell 60" in report["campaign"].get("stopped_early", ""), text[-3000:]
    cells = report["cells"]
    assert all(c["examples_this_run"] >= 60 or c["retired"] for c in cells), cells

    # The killed actor's shard was re-queued and then completed by a live actor.
    (shard_id, slot_index) = killed[0]
    assert campaign.requeued == [shard_id], text[-3000:]
    assert shard_id in campaign.completed
    assert [s for s, _ in campaign.dispatched].count(shard_id) == 2
    assert f"actor {slot_index} ({PLANTED}) died running" in text and "re-queued" in text

    signatures = [finding_from_dict(f).signature() for f in report["findings"]]
    assert len(signatures) == len(set(signatures))
    assert {s[:6] for s in signatures} >= BUG_SIGNATURES, text[-3000:]
    assert report["campaign"]["mode"] == "ray"
    assert report["campaign"]["ray"]["actors"] == 2
    assert report["campaign"]["ray"]["requeued"] == [shard_id]
    assert [f["property"] for f in _lines(out / "findings.jsonl")] == [
        f["property"] for f in report["findings"]
    ]
    # Reproducers written by the actors are shipped to the driver's directory.
    for finding in report["findings"]:
        if finding.get("reproducer"):
            assert Path(finding["reproducer"]).parent == out / "repro"
            assert "Reproducer: target" in Path(finding["reproducer"]).read_text()
    # Both actors did work; the coverage lines carry the target and the round.
    assert len({index for _, index in campaign.dispatched}) == 2
    coverage = _lines(out / "examples.jsonl")
    assert coverage and all(c["target"] == PLANTED and c["round"] is not None for c in coverage)
    assert report["examples_this_run"] >= len(coverage)
    # The actors' example databases were merged: each failing cell has its entries here.
    merged = db_entries(out / "examples")
    assert merged
    for finding in report["findings"]:
        from hashlib import sha384

        from bi_props.campaigns.explicit import variant_key
        from bi_props.campaigns.fuzz import database_key

        cell = (finding["op"], finding["property"], finding["switch"])
        key = database_key(PLANTED, *cell)
        if "explicit example" in finding["shrink"]:  # kept as a known stock-variant case
            key = variant_key(PLANTED, finding["op"])
        key = sha384(key).hexdigest()[:16]
        assert any(name.startswith(key + "/") for name in merged), cell

    # Resumed through the CLI on the running instance: the merged database replays the
    # failures first, nothing is reported twice.
    from bi_props.cli import main

    before = len(_lines(out / "findings.jsonl"))
    argv = [
        # 30 s: the replay of the merged database must fit even on loaded cores (12 s did not)
        *("fuzz", "--target", PLANTED, "--budget", "30", "--out", str(out)),
        *("--strategies", str(local_ray["strategies"]), "--ray", "--ray-actors", "2"),
        *("--resume", "--seed", "5"),
    ]
    assert main(argv) == 1
    assert len(_lines(out / "findings.jsonl")) == before
    resumed = json.loads((out / "report.json").read_text())
    assert [r["resumed"] for r in resumed["campaign"]["runs"]] == [False, True]
    statuses = {s["status"] for s in resumed["campaign"]["finding_status"]}
    assert "still failing" in statuses
