"""The webdataset stage on real .tar shards written with webdataset's TarWriter: DataLoader with 0
and 2 workers, rejects recorded, the shard index, and equal steps on gloo process groups."""

from __future__ import annotations

import gc
import json
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import webdataset as wds
from torch.utils.data import DataLoader

from tokenbucket import CostModel, ModelSpec, TokenSpec, breakdown_table
from tokenbucket.plan.buckets import plan_buckets
from tokenbucket.stream.bucketer import read_rejected
from tokenbucket.stream.dataset import StreamCollate
from tokenbucket.stream.emission import stream_batch_counts
from tokenbucket.stream.wds import bucketed, epoch_shards, index_shards
from tokenbucket.testing import mixture_a

# webdataset 1.0 leaves the last shard's file open when a pipeline ends (a plain WebDataset
# does too); collect it inside each test, where these filters apply, not in a later one
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _collect_leaked_shards() -> Any:
    yield
    gc.collect()


SPEC = TokenSpec(patch=112)  # mixture A scaled down: 27 .. ~3,000 tokens a sample
COST = CostModel(ModelSpec(hidden=32, layers=2, heads=4, precision="fp32", attention="flash"))
BUDGET = 24 * 2**20
FEATURES = 4


def write_shards(root: Path, n: int = 480, shards: int = 8, seed: int = 0, bad: bool = True) -> dict[str, Any]:
    """Shards of mixture A: per sample a float32 [L, 4] token tensor (.npy) and its .json metadata.
    With ``bad``: one corrupt .json in shard 2 and one oversize sample in shard 5."""
    rows = mixture_a(n, seed=seed).to_pylist()
    lengths = breakdown_table(pa.Table.from_pylist(rows), SPEC).totals
    plan = plan_buckets(lengths, COST, BUDGET, max_buckets=6, multiple=32)
    per = n // shards
    urls = []
    for s in range(shards):
        url = str(root / f"shard-{s:03d}.tar")
        urls.append(url)
        with wds.TarWriter(url) as sink:
            for i in range(s * per, (s + 1) * per):
                r = rows[i]
                tokens = np.full((int(lengths[i]), FEATURES), i, dtype=np.float32)
                sink.write({"__key__": r["key"], "json": json.dumps(r).encode(), "tokens.npy": tokens})
            if bad and s == 2:
                sink.write({"__key__": "corrupt-json", "json": b'{"cameras": 2, "frames":', "tokens.npy": tokens})
            if bad and s == 5:
                huge = {**rows[0], "key": "too-long", "cameras": 8, "frames": 64, "height": 896, "width": 896}
                sink.write({"__key__": "too-long", "json": json.dumps(huge).encode(), "tokens.npy": tokens[:1]})
    return {
        "urls": urls,
        "plan": plan,
        "keys": [r["key"] for r in rows],
        "lengths": dict(zip((r["key"] for r in rows), lengths.tolist(), strict=True)),
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return write_shards(tmp_path_factory.mktemp("shards"))


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_wds_every_sample_once_batches_fit_rejects_recorded(
    shards: dict[str, Any], tmp_path: Path, num_workers: int
) -> None:
    plan, rejected = shards["plan"], tmp_path / "rejected.jsonl"
    # the .json member is left to the stage (decoded upstream, a corrupt one would stop the pipeline)
    data = (
        wds.WebDataset(shards["urls"], shardshuffle=False, empty_check=False)
        .decode(only=["tokens.npy"])
        .compose(bucketed(plan, SPEC, cost_model=COST, rejected=str(rejected), max_buffered=64))
    )
    loader = DataLoader(data, batch_size=None, num_workers=num_workers, collate_fn=StreamCollate("tokens.npy"))
    keys: list[str] = []
    for batch in loader:
        info = batch["info"]
        b = plan.buckets[info.bucket]
        assert info.shape == (b.batch_size, b.bound) and batch["tokens"].shape == (*info.shape, FEATURES)
        assert info.predicted_peak_bytes <= plan.budget_bytes  # every batch fits the plan
        for r, key in enumerate(batch["keys"]):
            n = shards["lengths"][key]
            assert int(batch["attention_mask"][r].sum()) == n <= b.bound
            i = shards["keys"].index(key)
            assert bool((batch["tokens"][r, :n] == i).all())  # the sample's own data, not a neighbour's
        keys += batch["keys"]
    assert sorted(keys) == sorted(shards["keys"])  # every valid sample exactly once
    records = {r["key"]: r for r in read_rejected(rejected)}
    assert set(records) == {"corrupt-json", "too-long"}
    assert records["corrupt-json"]["reason"] == "invalid" and records["corrupt-json"]["shard"].endswith("002.tar")
    assert records["too-long"]["reason"] == "oversize" and records["too-long"]["shard"].endswith("005.tar")


def test_wds_index_reads_only_metadata_and_counts_like_the_stage(shards: dict[str, Any]) -> None:
    index = index_shards(shards["urls"], SPEC)
    assert index.samples == len(shards["keys"]) + 1 and index.rejected == 1  # too-long is valid metadata
    flat = dict(zip((k for ks in index.keys for k in ks), (n for ns in index.lengths for n in ns), strict=True))
    assert {k: flat[k] for k in shards["keys"]} == shards["lengths"]
    again = index.reorder(epoch_shards(shards["urls"], seed=1, epoch=0))
    assert sorted(again.urls) == sorted(index.urls) and again.urls != index.urls
    assert again.samples == index.samples


def test_wds_index_counts_upper_case_members_as_webdataset_reads_them(tmp_path: Path) -> None:
    import io
    import tarfile

    rows = mixture_a(6, seed=2).to_pylist()
    url = str(tmp_path / "mixed-case.tar")
    with tarfile.open(url, "w") as tar:
        for i, r in enumerate(rows):
            data = json.dumps(r).encode()
            info = tarfile.TarInfo(f"{r['key']}.{'JSON' if i % 2 else 'json'}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    seen = [s["__key__"] for s in wds.WebDataset([url], shardshuffle=False, empty_check=False) if "json" in s]
    index = index_shards([url], SPEC)
    assert index.samples == len(seen) == 6


@pytest.mark.slow
def test_wds_resume_across_a_shuffle_buffer_through_the_index(shards: dict[str, Any]) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tokenbucket.stream.dataset import BucketedStream

    plan, index = shards["plan"], index_shards(shards["urls"], SPEC)
    sizes = dict(zip(index.urls, (len(k) for k in index.keys), strict=True))

    def loader(seed: int) -> Any:
        source = (
            wds.WebDataset(shards["urls"], shardshuffle=False, empty_check=False, seed=seed)
            .shuffle(40, initial=40)
            .decode(only=["tokens.npy"])
        )  # samples of neighbouring shards mix
        stage = BucketedStream(source, plan, SPEC, cost_model=COST, shard_sizes=sizes, lookahead=8)
        return StatefulDataLoader(stage, batch_size=None, collate_fn=StreamCollate("tokens.npy"))

    first = loader(seed=1)
    it = iter(first)
    head = [k for _ in range(12) for k in next(it)["keys"]]
    state = first.state_dict()
    del it
    resumed = loader(seed=2)  # the buffer mixes differently on the second read: skipping is by key
    resumed.load_state_dict(state)
    tail = [k for b in resumed for k in b["keys"]]
    assert sorted(head + tail) == sorted(shards["keys"])  # nothing lost, nothing twice


def test_wds_with_epoch_gives_a_fixed_number_of_batches(shards: dict[str, Any]) -> None:
    data = (
        wds.WebDataset(shards["urls"], shardshuffle=False, empty_check=False)
        .decode(only=["tokens.npy"])
        .compose(bucketed(shards["plan"], SPEC, cost_model=COST))
        .with_epoch(7)
    )
    assert len(list(data)) == 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_worker(rank: int, world: int, port: int, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        meta = json.loads((Path(root) / "meta.json").read_text())
        urls = meta["urls"]
        from tokenbucket.plan.buckets import BucketPlan

        plan = BucketPlan.from_json(meta["plan"])
        # every rank computes the same count from the index (NOTE [ Equal steps from a shard index ])
        stage = index_shards(urls, SPEC).bucketed(plan, SPEC, world_size=world, num_workers=0, max_buffered=64)
        data = (
            wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False)
            .decode()
            .compose(stage)
        )
        loader = DataLoader(data, batch_size=None, num_workers=0, collate_fn=StreamCollate("tokens.npy"))
        keys, count = [], 0
        for batch in loader:
            keys += batch["keys"]
            count += 1
            # a collective every step, as training does: a rank with fewer steps would hang here
            dist.all_reduce(torch.ones(1))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"keys": keys, "steps": count})
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_wds_ddp_gloo_equal_steps_and_no_sample_on_two_ranks(tmp_path: Path, world: int) -> None:
    made = write_shards(tmp_path, n=420, shards=7, seed=5, bad=False)
    (tmp_path / "meta.json").write_text(json.dumps({"urls": made["urls"], "plan": made["plan"].to_json()}))
    out = tmp_path / "out.json"
    mp.spawn(_ddp_worker, args=(world, free_port(), str(tmp_path), str(out)), nprocs=world, join=True)
    ranks = json.loads(out.read_text())
    natural = stream_batch_counts(
        index_shards(made["urls"], SPEC).lengths, made["plan"], world_size=world, max_buffered=64
    )
    assert natural.min() < natural.max()  # left alone, the ranks would take different step counts
    assert len({r["steps"] for r in ranks}) == 1  # the same number of steps on every rank
    assert ranks[0]["steps"] == natural.max()
    everything = [k for r in ranks for k in r["keys"]]
    assert len(everything) == len(set(everything))  # no sample on two ranks (or twice on one)
    assert sorted(everything) == sorted(made["keys"])  # and, with the index's count, none left out
