"""Mutated models through all five commands a user runs on a file (inspect, check, optimize, bench,
convert): each ends with exit 0, or one line `tflfuse: error: ...` with exit 2 (check: 1 when a
runtime cannot run the model), never a traceback, and a refused convert writes nothing.

Light on purpose (a few seeds, one fresh process per model): `test_fuzz_loader.py` fuzzes the
loader alone with many more cases. The mutation is the one that made ../shared/models/hostile: 1-8
bytes overwritten at random offsets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from irgraphs import conv, fully_connected, model_of, unary

from tflfuse.ir import Graph, flatbuffer

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
SEEDS = (1, 3, 6, 8)  # 1, 3: refused by the loader; 6, 8: loaded, and through every command


def _classifier() -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (1, 6, 6, 2))
    r = unary(g, "RELU6", conv(g, x, 3).outputs[0]).outputs[0]
    flat = g.add_tensor("flat", (1, 108))
    shape = g.add_constant("shape", np.array([1, 108], "int32"))
    g.add_op("RESHAPE", [r, shape], [flat], {"new_shape": [1, 108]})
    logits = fully_connected(g, flat, 5).outputs[0]
    probs = unary(g, "SOFTMAX", logits).outputs[0]
    probs.dtype = "FLOAT32"
    return flatbuffer.to_bytes(model_of(g, [x], [probs]))


def _mutated(seed: int) -> bytes:
    data = bytearray(_classifier())
    rng = np.random.default_rng(1000 + seed)
    for _ in range(int(rng.integers(1, 9))):
        data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
    return bytes(data)


# each command in one process: the CLI's main() per argv, exit code and stderr's last line
_RUN = """
import contextlib, io, json, sys
from tflfuse.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = "raised " + type(exc).__name__
    results.append([argv[0], code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_a_mutated_model_through_every_command(tmp_path: Path, seed: int) -> None:
    import json

    model = tmp_path / "m.tflite"
    model.write_bytes(_mutated(seed))
    out = tmp_path / "out"
    m = str(model)
    commands = [
        ["inspect", m],
        ["check", m, "--target", "edgetpu"],
        ["check", m],
        ["optimize", m, "-o", str(tmp_path / "o.tflite")],
        ["bench", m, "--runs", "2", "--warmup", "0", "--no-progress"],
        ["convert", m, "--recipe", "cpu-float", "-o", str(out)],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RUN), json.dumps(commands)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for command, code, err in json.loads(proc.stdout.splitlines()[-1]):
        assert code in (0, 2), (command, code, err[-2000:])
        lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("tflfuse: error: ")]
        if code == 2:
            assert len(errors) == 1 and errors[0] == lines[-1], (command, err[-2000:])
            if command == "convert":
                assert not out.exists()
        else:
            assert not errors, (command, err[-2000:])


def test_the_seeds_reach_both_outcomes() -> None:
    """Some mutated models are refused at load, some go through every stage: a test of the
    commands on only one kind would miss half of them."""
    from tflfuse.errors import ModelError

    loaded = []
    for seed in SEEDS:
        try:
            flatbuffer.from_bytes(_mutated(seed), "m")
            loaded.append(seed)
        except ModelError:
            pass
    assert loaded == [6, 8]
