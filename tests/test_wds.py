"""The webdataset stage on real .tar shards written with webdataset's TarWriter: DataLoader with 0
and 2 workers, rejects recorded, the shard index, and equal steps on gloo process groups."""

from __future__ import annotations

import gc
import gzip
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import webdataset as wds
from torch.utils.data import DataLoader

from tests._dist import free_port, gloo_group, spawn
from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, breakdown_table
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


def _ddp_worker(rank: int, world: int, port: int, root: str, out: str) -> None:
    with gloo_group(rank, world, port):
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


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_wds_ddp_gloo_equal_steps_and_no_sample_on_two_ranks(tmp_path: Path, world: int) -> None:
    made = write_shards(tmp_path, n=420, shards=7, seed=5, bad=False)
    (tmp_path / "meta.json").write_text(json.dumps({"urls": made["urls"], "plan": made["plan"].to_json()}))
    out = tmp_path / "out.json"
    spawn(_ddp_worker, args=(world, free_port(), str(tmp_path), str(out)), nprocs=world)
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


# --- bad shards (NOTE [ Bad shards ]): truncated, empty or foreign shards are errors that name the
# shard and the byte, or, with on_bad_shard="skip", a counted and reported loss; never half a shard


def tar_shard(path: Path, n: int = 4, seed: int = 7) -> list[tarfile.TarInfo]:
    """A shard of ``n`` samples written with tarfile: ``<key>.json`` (valid metadata) then
    ``<key>.bin`` (700 bytes) each; returns its members (header and data offsets)."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for r in mixture_a(n, seed=seed).to_pylist():
            for ext, data in (("json", json.dumps(r).encode()), ("bin", bytes(range(256)) * 2 + bytes(188))):
                info = tarfile.TarInfo(f"{r['key']}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return tar.getmembers()


def snapshot(*paths: Path) -> dict[Path, tuple[bytes, int]]:
    """Each file's bytes and mtime: the index only reads shards, whatever they hold."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def cut_shard(tmp_path: Path, where: str) -> tuple[Path, int, int, str]:
    """A 4-sample shard cut at ``where``: its path, the cut byte, the samples whose metadata lies
    whole before the cut, and what the error says about the cut."""
    whole = tmp_path / "whole.tar"
    members = tar_shard(whole)
    end = members[-1].offset_data + 1024  # the last member's 700 bytes, padded to whole blocks
    third_json, third_bin = members[4], members[5]
    data = whole.read_bytes()
    cut, samples, says = {
        "inside a header": (third_json.offset + 100, 2, f"inside the tar header at byte {third_json.offset}"),
        "at a header boundary": (third_json.offset, 2, f"after member {members[3].name!r}: no end-of-archive"),
        "inside a member's data": (third_bin.offset_data + 300, 3, f"inside the data of member {third_bin.name!r}"),
        "before the end blocks": (end, 4, f"after member {members[-1].name!r}: no end-of-archive"),
        "between the end blocks": (end + 512, 4, f"inside the end-of-archive marker at byte {end}"),
    }[where]
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:cut])
    return bad, cut, samples, says


CUTS = [
    "inside a header",
    "at a header boundary",
    "inside a member's data",
    "before the end blocks",
    "between the end blocks",
]


@pytest.mark.parametrize("where", CUTS)
@pytest.mark.slow
def test_wds_index_truncated_shard_names_shard_and_byte(tmp_path: Path, where: str) -> None:
    bad, cut, samples, says = cut_shard(tmp_path, where)
    before = snapshot(bad)
    with pytest.raises(ConfigError) as info:
        index_shards([bad], SPEC)
    message = str(info.value)
    assert message.startswith(f"cannot read shard {str(bad)!r}: truncated at byte {cut}")
    assert says in message and f"({samples} samples read before that;" in message
    assert "on_bad_shard='skip'" in message and "\n" not in message
    assert snapshot(bad) == before


@pytest.mark.parametrize("where", CUTS)
@pytest.mark.slow
def test_wds_index_truncated_shard_skipped_counts_its_samples(tmp_path: Path, where: str) -> None:
    bad, cut, samples, _ = cut_shard(tmp_path, where)
    before = snapshot(bad)
    with pytest.warns(UserWarning, match=f"skipped shard {re.escape(repr(str(bad)))}: truncated at byte {cut}"):
        index = index_shards([bad], SPEC, on_bad_shard="skip")
    assert index.urls == () and index.samples == 0
    assert [(b.url, b.offset, b.samples) for b in index.skipped] == [(str(bad), cut, samples)]
    assert index.lost_samples == samples  # every metadata member read before the cut, counted
    assert snapshot(bad) == before


def test_wds_index_corrupt_header_mid_shard_is_an_error(tmp_path: Path) -> None:
    url = tmp_path / "corrupt.tar"
    members = tar_shard(url)
    data = bytearray(url.read_bytes())
    data[members[4].offset : members[4].offset + 512] = b"x" * 512  # the third sample's header
    url.write_bytes(bytes(data))
    before = snapshot(url)
    with pytest.raises(ConfigError, match=rf"no valid tar header at byte {members[4].offset} .*\(2 samples read"):
        index_shards([url], SPEC)
    assert snapshot(url) == before


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "empty (0 bytes), not a tar archive"),
        (b"key,cameras\na,2\n" * 100, "not a tar archive (no valid tar header at byte 0; it starts with b'key,"),
        (gzip.compress(b"not a tar, only text\n" * 100), "not a tar archive (no valid tar header at byte 0"),
    ],
    ids=["0-byte", "text", "gzip text"],
)
def test_wds_index_foreign_shard_is_an_error(tmp_path: Path, content: bytes, says: str) -> None:
    url = tmp_path / "foreign.tar"
    url.write_bytes(content)
    before = snapshot(url)
    with pytest.raises(ConfigError) as info:
        index_shards([url], SPEC)
    assert str(info.value).startswith(f"cannot read shard {str(url)!r}: {says}")
    assert "(0 samples read before that;" in str(info.value)
    assert snapshot(url) == before


def test_wds_index_gzip_shard_reads_whole_or_names_the_cut(tmp_path: Path) -> None:
    plain = tmp_path / "plain.tar"
    tar_shard(plain)
    packed = gzip.compress(plain.read_bytes())
    whole, cut = tmp_path / "whole.tar", tmp_path / "cut.tar"  # gzip data named .tar: tarfile's "r|*" reads it
    whole.write_bytes(packed)
    cut.write_bytes(packed[: len(packed) // 2])
    before = snapshot(plain, whole, cut)
    expected = index_shards([plain], SPEC)
    index = index_shards([whole], SPEC)
    assert (index.keys, index.lengths, index.samples) == (expected.keys, expected.lengths, 4)
    with pytest.raises(ConfigError) as info:
        index_shards([cut], SPEC)
    message = str(info.value)
    assert message.startswith(f"cannot read shard {str(cut)!r}: its gzip data ends early or is corrupt at byte ")
    assert "gzip-compressed, so byte offsets are in the decompressed tar" in message
    offset = int(message.split(" at byte ")[1].split(":")[0])
    assert 0 < offset < len(plain.read_bytes())  # a byte of the decompressed tar, not of the gzip file
    assert snapshot(plain, whole, cut) == before


def test_wds_index_skip_keeps_good_shards_and_reports_the_loss(tmp_path: Path) -> None:
    made = write_shards(tmp_path, n=60, shards=2, seed=3, bad=False)  # webdataset's TarWriter
    good = [Path(u) for u in made["urls"]]
    bad, cut, samples, _ = cut_shard(tmp_path, "at a header boundary")
    urls = [str(good[0]), str(bad), str(good[1])]
    before = snapshot(*good, bad)
    with pytest.raises(ConfigError, match=rf"cannot read shard {re.escape(repr(str(bad)))}: truncated at byte {cut}"):
        index_shards(urls, SPEC)  # the default: an error, not half a shard
    with pytest.warns(UserWarning, match=rf"skipped shard {re.escape(repr(str(bad)))}: .* its {samples} samples"):
        index = index_shards(urls, SPEC, on_bad_shard="skip")
    assert index.urls == (str(good[0]), str(good[1]))
    assert sorted(k for ks in index.keys for k in ks) == sorted(made["keys"])  # every good sample, once
    assert index.skipped[0].url == str(bad) and index.skipped[0].offset == cut
    assert index.lost_samples == samples == 2
    # the pipeline reads index.urls: all the good shards' samples arrive, nothing of the bad one
    seen = [s["__key__"] for s in wds.WebDataset(list(index.urls), shardshuffle=False, empty_check=False)]
    assert sorted(seen) == sorted(made["keys"])
    with pytest.raises(ConfigError, match=rf"shard {re.escape(repr(str(bad)))} was skipped by index_shards"):
        index.reorder(urls)
    assert index.reorder(list(reversed(index.urls))).skipped == index.skipped
    assert snapshot(*good, bad) == before


def test_wds_index_bad_options_and_missing_shard_are_errors(tmp_path: Path) -> None:
    url = tmp_path / "a.tar"
    tar_shard(url)
    with pytest.raises(ConfigError, match="on_bad_shard should be 'error' or 'skip', but got on_bad_shard='ignore'"):
        index_shards([url], SPEC, on_bad_shard="ignore")  # type: ignore[arg-type]
    missing = tmp_path / "missing.tar"
    with pytest.raises(ConfigError, match=rf"cannot open shard {re.escape(repr(str(missing)))}: "):
        index_shards([url, missing], SPEC, on_bad_shard="skip")  # a wrong path is not a loss to skip
    assert not missing.exists()
