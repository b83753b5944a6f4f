"""``plan --out`` / ``build_manifest(out=...)``: nothing tokenbucket did not create is deleted or
overwritten (NOTE [ Safe output ]).

Invariants: a refused ``--out`` ends as exit status 1 with one line on stderr naming the path (no
traceback), and every file that existed before the call is byte-identical afterwards; an
accepted one holds a manifest that verifies, with one row per input sample.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokenbucket import ConfigError, CostModel, ModelSpec, TokenSpec, gpu_budget_bytes
from tokenbucket.cli.main import main
from tokenbucket.plan.manifest import build_manifest, load_manifest
from tokenbucket.testing import mixture_a

SPEC = TokenSpec(patch=14)
COST = CostModel(ModelSpec.preset("design-24L-1024"), "H100-SXM")
BUDGET = gpu_budget_bytes("H100-SXM")
ROWS = 300


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` (not following links): a file's bytes, a link's target, a dir's mark."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "<dir>"
            else:
                found[rel] = path.read_bytes()
    return found


def plan(capsys: pytest.CaptureFixture[str], src: Path, out: str | Path, *flags: str) -> tuple[int, str]:
    code = main(["plan", str(src), "--gpu", "H100-SXM", "--on-oversize", "reject", "--out", str(out), "--json", *flags])
    return code, capsys.readouterr().err


def assert_refused(code: int, err: str, *needles: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("tokenbucket plan: error: ")
    for needle in needles:
        assert needle in err, err


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "meta.parquet"
    pq.write_table(mixture_a(ROWS, seed=7), path)
    return path


def test_out_safety_directory_with_user_files_is_refused_even_with_force(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user = tmp_path / "results"
    (user / "sub").mkdir(parents=True)
    (user / "notes.txt").write_text("a week of notes")
    (user / "sub" / "model.pt").write_bytes(b"\x00weights")
    pq.write_table(mixture_a(5, seed=1), user / "part-00000.parquet")  # a part name, but not ours
    before = snapshot(tmp_path)
    for flags in ((), ("--force",)):
        code, err = plan(capsys, src, user, *flags)
        assert_refused(code, err, "'" + str(user) + "'", "pass another path", "never replaces a directory")
        assert snapshot(tmp_path) == before


def test_out_safety_the_input_itself_is_refused_even_with_force(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    os.link(src, tmp_path / "hard.parquet")  # the same file under another name
    before = snapshot(tmp_path)
    for out in (src, Path("meta.parquet"), Path("./sub/../meta.parquet"), tmp_path / "hard.parquet"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        for flags in ((), ("--force",)):
            code, err = plan(capsys, src, out, *flags)
            assert_refused(code, err, "is (or holds) the metadata input", "never overwrites an input")
        (tmp_path / "sub").rmdir()
        assert snapshot(tmp_path) == before
    # a directory holding the input is refused too (it holds more than manifest parts anyway)
    code, err = plan(capsys, tmp_path, tmp_path)
    assert_refused(code, err, "metadata input")
    assert snapshot(tmp_path) == before


def test_out_safety_dot_and_symlinks_are_clear_errors(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "keep.txt").write_text("keep")
    (tmp_path / "to_dir").symlink_to("runs")
    (tmp_path / "dangling").symlink_to("nowhere.parquet")
    build_manifest(src, SPEC, COST, tmp_path / "real.parquet", budget_bytes=BUDGET, on_oversize="reject")
    (tmp_path / "to_manifest.parquet").symlink_to("real.parquet")
    before = snapshot(tmp_path)
    for out, needle in (
        (".", "names a directory"),
        ("..", "names a directory"),
        (str(tmp_path) + "/.", "metadata input"),
    ):
        code, err = plan(capsys, src, out, "--force")
        assert_refused(code, err, needle)
    for link in ("to_dir", "dangling", "to_manifest.parquet"):
        code, err = plan(capsys, src, link, "--force")
        assert_refused(code, err, f"'{link}' is a symbolic link")
    code, err = plan(capsys, src, "missing/m.parquet")
    assert_refused(code, err, "'missing' does not exist")
    assert snapshot(tmp_path) == before


def test_out_safety_a_foreign_file_needs_force_and_a_manifest_is_replaced(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.parquet"
    pq.write_table(mixture_a(10, seed=2), other)  # Parquet, but not a manifest
    text = tmp_path / "notes.parquet"
    text.write_text("not parquet at all")
    before = snapshot(tmp_path)
    for out in (other, text):
        code, err = plan(capsys, src, out)
        assert_refused(code, err, f"'{out}' exists and is not a tokenbucket manifest", "--force")
    assert snapshot(tmp_path) == before
    # --force replaces a foreign file (only that one)
    code, _ = plan(capsys, src, other, "--force")
    assert code == 0 and len(load_manifest(other)) == ROWS
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "other.parquet"} == {
        k: v for k, v in before.items() if k != "other.parquet"
    }
    # a manifest is ours: replaced without --force, file by file and directory by directory
    first = load_manifest(other).content_hash
    code, _ = plan(capsys, src, other)
    assert code == 0 and load_manifest(other).content_hash == first
    parts = tmp_path / "parts"
    for _ in range(2):
        code, _ = plan(capsys, src, parts)
        assert code == 0 and [p.name for p in parts.iterdir()] == ["part-00000.parquet"]
        assert len(load_manifest(parts)) == ROWS
    # a directory of our parts plus one stranger is not ours
    (parts / "README").write_text("mine")
    before = snapshot(tmp_path)
    code, err = plan(capsys, src, parts, "--force")
    assert_refused(code, err, "holding 'README'")
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries left


def test_out_safety_library_refuses_like_the_cli(src: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "a.txt").write_text("a")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"is a directory holding 'a\.txt'"):
        build_manifest(src, SPEC, COST, user, budget_bytes=BUDGET, on_oversize="reject", force=True)
    with pytest.raises(ConfigError, match="metadata input"):
        build_manifest(src, SPEC, COST, src, budget_bytes=BUDGET, on_oversize="reject", force=True)
    assert snapshot(tmp_path) == before
    # an empty directory holds nothing to lose: it becomes the manifest's directory
    empty = tmp_path / "empty"
    empty.mkdir()
    m = build_manifest(src, SPEC, COST, empty, budget_bytes=BUDGET, on_oversize="reject")
    assert len(m) == ROWS and len(load_manifest(empty).table) == ROWS


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_out_safety_stale_temporaries_of_dead_builds_are_removed_nothing_else(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.parquet"
    dead, alive = _dead_pid(), os.getppid()
    stale_file = tmp_path / f".m.parquet.{dead}.tmp"
    stale_file.write_bytes(b"PAR1 half a manifest")
    # another process that has exited (not dead + 1: the next pid handed out, often alive by the build)
    stale_dir = tmp_path / f".m.parquet.{_dead_pid()}.tmp"
    stale_dir.mkdir()
    (stale_dir / "part-00000.parquet").write_bytes(b"PAR1 half")
    decoys = [
        tmp_path / f".m.parquet.{alive}.tmp",  # a build still running
        tmp_path / f".other.parquet.{dead}.tmp",  # another output's
        tmp_path / f".m.parquet.{dead}.tmp.bak",  # not our pattern
        tmp_path / f"m.parquet.{dead}.tmp",  # not hidden: not ours
        tmp_path / f".m.parquet.{dead}.txt",
    ]
    for d in decoys:
        d.write_bytes(b"user data " + d.name.encode())
    foreign_dir = tmp_path / f".m.parquet.{dead}.old"  # our pattern, but holding a user's file
    foreign_dir.mkdir()
    (foreign_dir / "thesis.tex").write_text("do not delete")
    stale = (stale_file.name, stale_dir.name, f"{stale_dir.name}/part-00000.parquet")
    before = {k: v for k, v in snapshot(tmp_path).items() if k not in stale}
    code, _ = plan(capsys, src, out)
    assert code == 0 and len(load_manifest(out)) == ROWS
    assert not stale_file.exists() and not stale_dir.exists()
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "m.parquet"} == before


def test_out_safety_a_kill_between_the_two_renames_gives_the_old_manifest_back(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "parts"
    old = build_manifest(src, SPEC, COST, out, budget_bytes=BUDGET, on_oversize="reject")
    dead = _dead_pid()
    # what a build killed between parking the old directory and moving the new one in leaves
    parked, half = tmp_path / f".parts.{dead}.old", tmp_path / f".parts.{dead}.tmp"
    out.rename(parked)
    half.mkdir()
    (half / "part-00000.parquet").write_bytes(b"PAR1")
    # the next build puts the old one back before anything else (here it then fails: no budget)
    with pytest.raises(ConfigError, match="needs budget_bytes"):
        build_manifest(src, SPEC, COST, out)
    assert load_manifest(out).content_hash == old.content_hash
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.parquet", "parts"]


def test_out_safety_our_temporary_name_on_a_users_file_is_left_alone(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.parquet"
    users = tmp_path / f".m.parquet.{_dead_pid()}.tmp"  # our pattern, a dead pid, not Parquet
    users.write_text("notes the user happened to name like this")
    code, _ = plan(capsys, src, out)
    assert code == 0 and len(load_manifest(out)) == ROWS
    assert users.read_text() == "notes the user happened to name like this"


def test_out_safety_a_killed_ray_builds_scratch_is_removed_a_users_look_alike_is_not(src: Path, tmp_path: Path) -> None:
    """NOTE [ Safe output ]: the Ray engine's scratch directory of a dead build goes; one of our name
    holding anything else, or of a live process, stays."""
    dead, alive = _dead_pid(), os.getppid()
    scratch = tmp_path / f".m.parquet.{dead}.k2_9xq0a.ray"
    scratch.mkdir()
    for name in ("000000-000000.arrow", "000001-000003.arrow"):
        (scratch / name).write_bytes(b"ARROW1 half")
    keep = [tmp_path / f".m.parquet.{dead}.abcdefgh.ray", tmp_path / f".m.parquet.{alive}.abcdefgh.ray"]
    keep[0].mkdir()
    (keep[0] / "notes.txt").write_text("a user's")  # our name, not our contents
    keep[1].mkdir()
    (keep[1] / "000000-000000.arrow").write_bytes(b"a live build's")
    before = {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(scratch.name)}
    build_manifest(src, SPEC, COST, tmp_path / "m.parquet", budget_bytes=BUDGET, on_oversize="reject")
    assert not scratch.exists()
    assert {k: v for k, v in snapshot(tmp_path).items() if k != "m.parquet"} == before
