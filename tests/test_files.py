"""Output folders (`tflfuse.files.prepare_output` / `publish`): any filesystem, no silent
overwrite, `force` replaces only the files tflfuse's manifest proves it wrote (everything else,
the user's, survives byte for byte), signals and killed runs leave nothing behind, the
umask is respected. Fast: plain files, no TensorFlow."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tflfuse import files
from tflfuse.errors import TflfuseError


def _run(out: Path, names: dict[str, str], *, force: bool = False) -> list[str]:
    """What convert does: prepare, write the result into the temp folder, publish."""
    tmp = files.prepare_output(out, force=force, names=names)
    for name, text in names.items():
        (tmp / name).write_text(text)
    return files.publish(tmp, out, force=force)


def _leftovers(folder: Path) -> list[str]:
    """tflfuse's temp folders and files in `folder` (none may survive a run)."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if (p.is_dir() and files._TEMP_TAG in p.name) or p.name.endswith(".tmp")
    )


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder` with its bytes (None for a folder): for byte-for-byte checks."""
    return {
        str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(folder.rglob("*"))
    }


def _users_project(folder: Path) -> None:
    """A folder of the user's own: sources, a sub-folder, and a report.json of their own."""
    folder.mkdir(exist_ok=True)
    (folder / "main.c").write_text("int main(void) { return 0; }\n")
    (folder / "src").mkdir()
    (folder / "src" / "util.c").write_bytes(bytes(range(256)))
    (folder / "report.json").write_text('{"quarterly": "numbers"}\n')


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_new_folder_gets_the_umask_mode_and_a_manifest(tmp_path: Path, umask_027: None) -> None:
    out = tmp_path / "out"
    assert _run(out, {"report.json": "{}", "model.tflite": "m"}) == []
    assert sorted(p.name for p in out.iterdir()) == [files.MANIFEST, "model.tflite", "report.json"]
    assert out.stat().st_mode & 0o777 == 0o750  # not mkdtemp's 0700
    assert (out / "model.tflite").stat().st_mode & 0o777 == 0o640
    manifest = files.read_manifest(out)
    assert manifest == {
        "model.tflite": hashlib.sha256(b"m").hexdigest(),
        "report.json": hashlib.sha256(b"{}").hexdigest(),
    }
    assert _leftovers(tmp_path) == []


def test_earlier_result_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old"})
    with pytest.raises(TflfuseError, match=r"out: holds an earlier tflfuse result \(pass --force"):
        files.prepare_output(out)
    assert (out / "report.json").read_text() == "old"
    assert _leftovers(tmp_path) == [] and _leftovers(out) == []


# -- the three data-loss cases of issue 16 -------------------------------------------------------
def test_a_report_json_does_not_make_a_folder_a_result(tmp_path: Path) -> None:
    """Case 1: a folder holding any report.json counted as a tflfuse result, and --force deleted
    the user's main.c and src/. Now it is refused, whatever the flags, and nothing changes."""
    project = tmp_path / "project"
    _users_project(project)
    before = _tree(project)
    for force in (False, True):
        with pytest.raises(TflfuseError, match="holds no tflfuse result") as err:
            files.prepare_output(project, force=force, names=["report.json", "model.tflite"])
        assert "main.c" in str(err.value) and "src/" in str(err.value)
    assert _tree(project) == before
    assert _leftovers(tmp_path) == [] and _leftovers(project) == []


def test_the_current_folder_and_its_ancestors_are_never_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 2: `-o . --force` (and `-o ''`) deleted the current folder's files."""
    work = tmp_path / "home" / "me" / "work"
    work.mkdir(parents=True)
    _users_project(work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "me"))
    before = _tree(tmp_path)
    cases = {
        ".": "holds no tflfuse result",
        "": "the output folder name is empty",
        "..": "the home folder",
        "../..": "a folder that holds the current folder",
        "/": "the root folder",
        str(work): "holds no tflfuse result",
    }
    for where, expect in cases.items():
        with pytest.raises(TflfuseError, match=expect):
            files.prepare_output(where, force=True)
    assert _tree(tmp_path) == before


def test_force_keeps_the_users_files_beside_a_result(tmp_path: Path) -> None:
    """Case 3: --force over a real earlier result deleted the user's notes and device runs
    beside it. Now only the files tflfuse wrote are replaced (a stale one removed); the user's
    are kept byte for byte, and named."""
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "model.tflite": "old model", "bench.json": "stale"})
    (out / "notes.md").write_text("the int8 model loses 0.3 % top-1\n")
    (out / "runs").mkdir()
    (out / "runs" / "coral.json").write_bytes(b'{"p50_ms": 7.1}\x00\xff')
    theirs = {k: v for k, v in _tree(out).items() if k.startswith(("notes", "runs"))}
    os.chmod(out, 0o755)
    kept = _run(out, {"report.json": "new", "model.tflite": "new model"}, force=True)
    assert kept == ["notes.md", "runs"]
    assert {k: v for k, v in _tree(out).items() if k.startswith(("notes", "runs"))} == theirs
    assert (out / "report.json").read_text() == "new"
    assert not (out / "bench.json").exists()  # tflfuse's, stale: removed
    assert set(files.read_manifest(out) or {}) == {"report.json", "model.tflite"}
    assert out.stat().st_mode & 0o777 == 0o755  # the folder itself is kept, with its mode
    assert _leftovers(tmp_path) == [] and _leftovers(out) == []


def test_force_refuses_files_changed_since_tflfuse_wrote_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "report.md": "# result"})
    (out / "report.md").write_text("# result\n\nmy notes on it\n")
    before = _tree(out)
    with pytest.raises(TflfuseError, match=r"report\.md changed since tflfuse wrote them"):
        files.prepare_output(out, force=True)
    assert _tree(out) == before


def test_a_file_of_the_users_with_a_result_name_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old"})
    (out / "model.tflite").write_bytes(b"the user's own model")
    before = _tree(out)
    with pytest.raises(TflfuseError, match=r"holds model\.tflite, which tflfuse did not write"):
        files.prepare_output(out, force=True, names=["model.tflite", "report.json"])
    # without the names up front, publish refuses it before anything moves
    tmp = files.prepare_output(out, force=True)
    (tmp / "model.tflite").write_text("new")
    with pytest.raises(TflfuseError, match=r"model\.tflite appeared while tflfuse worked"):
        files.publish(tmp, out, force=True)
    files.discard(tmp)
    assert _tree(out) == before


def test_an_older_result_without_a_manifest_is_not_replaced(tmp_path: Path) -> None:
    """What an older tflfuse wrote cannot be told from the user's files: refused, kept."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("model.tflite", "model_stock.tflite", "report.json", "report.md"):
        (out / name).write_text(name)
    before = _tree(out)
    with pytest.raises(TflfuseError, match=r"a report.json alone does not make one"):
        files.prepare_output(out, force=True)
    assert _tree(out) == before


@pytest.mark.parametrize(
    "manifest",
    [
        b"{not json",
        b'{"files": {"../victim.txt": "' + b"0" * 64 + b'"}}',
        b'{"files": {"/etc/passwd": "' + b"0" * 64 + b'"}}',
        b'{"files": ["model.tflite"]}',
    ],
)
def test_an_unreadable_or_escaping_manifest_proves_nothing(tmp_path: Path, manifest: bytes) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old"})
    (out / files.MANIFEST).write_bytes(manifest)
    (tmp_path / "victim.txt").write_text("keep me")
    before = _tree(tmp_path)
    with pytest.raises(TflfuseError, match="cannot tell which files it wrote"):
        files.prepare_output(out, force=True)
    assert _tree(tmp_path) == before


def test_a_manifest_of_listed_files_the_user_removed_is_still_a_result(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "model.tflite": "m"})
    (out / "model.tflite").unlink()
    assert _run(out, {"report.json": "new", "model.tflite": "n"}, force=True) == []
    assert (out / "model.tflite").read_text() == "n"


def test_empty_existing_folder_is_filled_in_place(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    inode = out.stat().st_ino
    _run(out, {"report.json": "{}"})
    assert sorted(p.name for p in out.iterdir()) == [files.MANIFEST, "report.json"]
    assert out.stat().st_ino == inode  # filled, not replaced (it may be a shell's folder)


def test_the_current_folder_when_empty_is_filled_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _run(Path("."), {"report.json": "{}"})
    assert Path.cwd().stat().st_ino == tmp_path.stat().st_ino
    assert (tmp_path / "report.json").is_file()
    assert _run(Path("."), {"report.json": "new"}, force=True) == []


def test_output_on_another_device_builds_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing OUT (perhaps its own mount point) is built inside: no rename across devices;
    the temp folder is made inside OUT and its files are renamed into place."""
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "bench.json": "stale"})
    tmp = files.prepare_output(out, force=True)
    assert tmp.parent == out.resolve()
    (tmp / "report.json").write_text("new")
    files.publish(tmp, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == [files.MANIFEST, "report.json"]
    assert (out / "report.json").read_text() == "new"


def test_writable_folder_under_a_read_only_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(files, "_writable", lambda folder: Path(folder) != tmp_path.resolve())
    tmp = files.prepare_output(out)
    assert tmp.parent == out.resolve()  # built inside, not beside
    (tmp / "report.json").write_text("{}")
    files.publish(tmp, out)
    assert sorted(p.name for p in out.iterdir()) == [files.MANIFEST, "report.json"]
    assert _leftovers(tmp_path) == [] and _leftovers(out) == []


def test_a_real_mount_point(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        assert mnt.stat().st_dev != tmp_path.stat().st_dev
        _run(mnt, {"report.json": "a", "bench.json": "stale"})
        (mnt / "notes.md").write_text("mine")
        assert _run(mnt, {"report.json": "b"}, force=True) == ["notes.md"]
        assert sorted(p.name for p in mnt.iterdir()) == [files.MANIFEST, "notes.md", "report.json"]
        assert (mnt / "report.json").read_text() == "b"
        assert _leftovers(tmp_path) == [] and _leftovers(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_unwritable_place_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "_writable", lambda folder: False)
    with pytest.raises(TflfuseError, match="permission denied"):
        files.prepare_output(tmp_path / "out")
    with pytest.raises(TflfuseError, match=r"parent folder .* does not exist"):
        files.prepare_output(tmp_path / "no" / "out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TflfuseError, match="exists and is not a folder"):
        files.prepare_output(tmp_path / "file")


# -- temp folders of killed runs -----------------------------------------------------------------
_KILLED_RUN = """
import os, signal, sys
from pathlib import Path
from tflfuse import files
tmp = files.prepare_output(Path(sys.argv[1]))
(tmp / "model.tflite").write_bytes(b"x" * 1000)
print(tmp, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_run(out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    tmp = Path(proc.stdout.strip())
    assert tmp.is_dir() and (tmp / files.TEMP_MARKER).is_file()
    return tmp


@pytest.mark.parametrize("exists", [False, True])
def test_temp_folders_of_killed_runs_are_removed_by_the_next_run(
    tmp_path: Path, exists: bool
) -> None:
    out = tmp_path / "out"
    if exists:
        out.mkdir()
    stale = _killed_run(out)
    assert stale.parent == (out if exists else tmp_path)
    # one without tflfuse's marker, and one of a live run, are not provably stale: kept
    unmarked = stale.parent / f".out{files._TEMP_TAG}unmarked"
    unmarked.mkdir()
    (unmarked / "data").write_text("whose?")
    live = files.prepare_output(out)
    files.prepare_output(out)  # the next run: removes the stale one only
    assert not stale.exists()
    assert (unmarked / "data").read_text() == "whose?"
    assert live.is_dir()
    files.discard(live)


def test_discard_removes_only_a_marked_temp_folder(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "file").write_text("x")
    files.discard(mine)
    assert (mine / "file").read_text() == "x"


# the CLI's real entry point (its signal handling and messages) around a command that writes
# an output folder the way convert does, slowly
_SLOW_WRITER = """
import signal, sys, time
from pathlib import Path
from tflfuse import files
from tflfuse.cli import main

# SIGINT as a terminal delivers it (a shell's background job inherits it ignored, and Python
# keeps an inherited SIG_IGN; tflfuse leaves an ignored signal ignored, as for a nohup'd run)
signal.signal(signal.SIGINT, signal.default_int_handler)

def slow(args):
    tmp = files.prepare_output(Path(sys.argv[1]))
    try:
        (tmp / "model.tflite").write_bytes(b"x" * 1000)
        Path(sys.argv[2]).write_text(str(tmp))  # stdout is captured (tflfuse.quiet)
        time.sleep(60)
        files.publish(tmp, Path(sys.argv[1]))
    except BaseException:
        files.discard(tmp)
        raise
    return 0

import tflfuse.cli.inspect
tflfuse.cli.inspect.run = slow  # what `tflfuse inspect` runs
sys.exit(main(["inspect", "x"]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_nothing_behind(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "out"
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(_SLOW_WRITER))
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if ready.exists() and ready.read_text():
            break
        time.sleep(0.05)
    tmp = Path(ready.read_text())
    assert tmp.is_dir() and (tmp / "model.tflite").is_file()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if signum == signal.SIGINT else 128 + signum)
    assert err.count("\n") == 1 and err.startswith("tflfuse: ")
    assert not tmp.exists() and not out.exists()
    assert _leftovers(tmp_path) == []


# -- the three data-loss cases through `tflfuse convert`, as the user met them -------------------
def _convert(model: Path, out: str, *extra: str, cwd: Path | None = None) -> Any:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = ["convert", str(model), "--recipe", "cpu-float", "-o", out, *extra]
    return subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def _one_line(proc: Any, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tflfuse: error: ")
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_convert_force_into_a_project_folder_deletes_nothing(
    tmp_path: Path, tiny_tflite: Path
) -> None:
    project = tmp_path / "project"
    _users_project(project)
    before = _tree(project)
    _one_line(_convert(tiny_tflite, str(project), "--force"), "holds no tflfuse result")
    assert _tree(project) == before
    assert _leftovers(tmp_path) == [] and _leftovers(project) == []


def test_convert_force_into_the_current_folder_deletes_nothing(
    tmp_path: Path, tiny_tflite: Path
) -> None:
    work = tmp_path / "work"
    _users_project(work)
    before = _tree(tmp_path)
    for out in (".", ""):
        proc = _convert(tiny_tflite, out, "--force", cwd=work)
        _one_line(proc, "holds no tflfuse result" if out else "output folder name is empty")
    _one_line(_convert(tiny_tflite, "..", "--force", cwd=work), "holds the current folder")
    assert _tree(tmp_path) == before


def test_convert_force_over_an_earlier_result_keeps_notes_and_device_runs(
    tmp_path: Path, tiny_tflite: Path
) -> None:
    out = tmp_path / "out"
    first = _convert(tiny_tflite, str(out))
    assert first.returncode == 0, first.stderr
    written = set(files.read_manifest(out) or {})
    assert {"model.tflite", "model_stock.tflite", "report.json"} <= written
    (out / "notes.md").write_text("fused p50 7.1 ms on the Coral\n")
    (out / "device_runs").mkdir()
    (out / "device_runs" / "bench_coral.json").write_bytes(b'{"p50": 7.1}')
    theirs = {k: v for k, v in _tree(out).items() if k.startswith(("notes", "device_runs"))}
    again = _convert(tiny_tflite, str(out), "--force")
    assert again.returncode == 0, again.stderr
    assert "kept 2 files tflfuse did not write: device_runs, notes.md" in again.stdout
    assert {k: v for k, v in _tree(out).items() if k.startswith(("notes", "device_runs"))} == theirs
    assert set(files.read_manifest(out) or {}) == written
    assert _leftovers(tmp_path) == [] and _leftovers(out) == []
