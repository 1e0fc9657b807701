"""Output folders (`tflfuse.files.prepare_output` / `publish`): any filesystem, no silent
overwrite, `force` replaces an earlier result as a whole, signals leave nothing behind, the
umask is respected. Fast: plain files, no TensorFlow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tflfuse import files
from tflfuse.errors import TflfuseError


def _run(out: Path, names: dict[str, str], *, force: bool = False) -> None:
    """What convert does: prepare, write the result into the temp folder, publish."""
    tmp = files.prepare_output(out, force=force)
    for name, text in names.items():
        (tmp / name).write_text(text)
    files.publish(tmp, out, force=force)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if files._TEMP_TAG in p.name)


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_new_folder_gets_the_umask_mode(tmp_path: Path, umask_027: None) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "{}", "model.tflite": "m"})
    assert sorted(p.name for p in out.iterdir()) == ["model.tflite", "report.json"]
    assert out.stat().st_mode & 0o777 == 0o750  # not mkdtemp's 0700
    assert (out / "model.tflite").stat().st_mode & 0o777 == 0o640
    assert _leftovers(tmp_path) == []


def test_non_empty_folder_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old"})
    with pytest.raises(TflfuseError, match=r"out: folder is not empty \(pass --force"):
        files.prepare_output(out)
    assert (out / "report.json").read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_force_refuses_a_folder_that_is_not_a_tflfuse_result(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(TflfuseError, match="holds no earlier tflfuse result"):
        files.prepare_output(tmp_path, force=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_force_replaces_the_earlier_result_and_drops_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "bench.json": "stale"})
    os.chmod(out, 0o755)
    _run(out, {"report.json": "new", "model.tflite": "m"}, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["model.tflite", "report.json"]
    assert (out / "report.json").read_text() == "new"
    assert out.stat().st_mode & 0o777 == 0o755  # the replaced folder's mode is kept
    assert _leftovers(tmp_path) == []


def test_empty_existing_folder_is_filled(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _run(out, {"report.json": "{}"})
    assert [p.name for p in out.iterdir()] == ["report.json"]


def test_output_on_another_device_builds_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a mount point (or a writable mount under a read-only parent): no rename across
    devices; the temp folder is made inside OUT and its files are moved in."""
    out = tmp_path / "out"
    _run(out, {"report.json": "old", "bench.json": "stale"})
    monkeypatch.setattr(files, "_same_device", lambda a, b: False)
    tmp = files.prepare_output(out, force=True)
    assert tmp.parent == out.resolve()
    (tmp / "report.json").write_text("new")
    files.publish(tmp, out, force=True)
    assert [p.name for p in out.iterdir()] == ["report.json"]
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
    assert [p.name for p in out.iterdir()] == ["report.json"]
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
        _run(mnt, {"report.json": "b"}, force=True)
        assert [p.name for p in mnt.iterdir()] == ["report.json"]
        assert (mnt / "report.json").read_text() == "b"
        assert _leftovers(tmp_path) == []
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


# the CLI's real entry point (its signal handling and messages) around a command that writes
# an output folder the way convert does, slowly
_SLOW_WRITER = """
import sys, time
from pathlib import Path
from tflfuse import files
from tflfuse.cli import main

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

import tflfuse.cli as cli
cli._run_inspect = slow
sys.exit(main(["inspect", "x"]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_nothing_behind(tmp_path: Path, signum: int) -> None:
    if signal.getsignal(signum) == signal.SIG_IGN:  # e.g. SIGINT in a shell's background job
        pytest.skip(
            "this process ignores the signal, so the child inherits that and keeps ignoring it"
        )
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
