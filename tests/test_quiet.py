"""Quiet by default: library output (C++ on fds 1/2, Python warnings, logging, foreign progress
bars) is captured; tflfuse's own lines pass; `-v` shows everything. Fast: no TensorFlow."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse import quiet
from tflfuse.convert.pipeline import _note
from tflfuse.ir import Graph


def test_library_output_is_captured_and_tflfuse_lines_pass(capsys: pytest.CaptureFixture) -> None:
    from tqdm import tqdm

    library_logger = logging.getLogger("somelib")
    library_logger.propagate = False  # as absl's: its own handler, made once the library loads
    with quiet.captured() as log:
        library_logger.addHandler(logging.StreamHandler())
        os.write(2, b"C++ on fd 2\n")
        os.write(1, b"C++ on fd 1\n")
        print("a library's print")  # this test module is not tflfuse's code
        warnings.warn("a library warning", UserWarning, stacklevel=1)
        logging.getLogger("somelib").warning("a library log line")
        for _ in tqdm(range(3), desc="foreign bar"):
            pass
        _note("own note", quiet=False)  # tflfuse.convert's own stderr line
    library_logger.handlers.clear()
    shown = capsys.readouterr()
    assert shown.out == "" and shown.err == "tflfuse: own note\n"
    text = log.text()
    for line in ("C++ on fd 2", "C++ on fd 1", "a library's print", "a library warning"):
        assert line in text
    assert "a library log line" in text and "foreign bar" in text
    assert "own note" not in text


def test_everything_is_restored_after_an_exception() -> None:
    out, err, show = sys.stdout, sys.stderr, warnings.showwarning
    fd2 = os.fstat(2)
    with pytest.raises(RuntimeError), quiet.captured():
        raise RuntimeError("boom")
    assert (sys.stdout, sys.stderr, warnings.showwarning) == (out, err, show)
    assert (os.fstat(2).st_ino, os.fstat(2).st_dev) == (fd2.st_ino, fd2.st_dev)


def test_the_cli_hides_the_interpreters_banner_unless_verbose(tmp_path: Path) -> None:
    """A real process: the XNNPACK "INFO: Created TensorFlow Lite XNNPACK delegate" line is
    written by C++ to fd 2, below anything Python can redirect."""
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    y = unary(g, "RELU", conv(g, x, 4, name="c").outputs[0]).outputs[0]
    model = tmp_path / "tiny.tflite"
    model.write_bytes(to_bytes(model_of(g, [x], [y])))
    base = [sys.executable, "-m", "tflfuse.cli", "bench", str(model), "--runs", "2"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *extra], capture_output=True, text=True, check=True)

    verbose = run("--no-progress", "-v")
    assert "XNNPACK delegate" in verbose.stderr  # the banner exists: the test can fail
    normal = run()
    assert "XNNPACK delegate" not in normal.stderr + normal.stdout
    assert "bench" in normal.stderr  # tflfuse's own progress bar still shows
    assert normal.stdout.splitlines()[0].startswith("delegate xnnpack")
