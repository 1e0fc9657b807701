"""delegates/runtimes.toml against real interpreters: every interpreter reachable here (this
environment's ai-edge-litert and TensorFlow, and the venvs TFLFUSE_RUNTIMES names, made by
benchmarks/install_runtimes.py: tflite-runtime 2.7-2.14 on Python 3.7/3.8) builds exactly the
operator codes the table says it has, refuses the others in the words tflfuse predicts, and loads,
allocates and invokes exactly the models `tflfuse.targets.runtimes` says it runs. Runtimes that are
not
installed are skipped, by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import runtime_kit as kit
from rulekit import G
from runtime_kit import SHARED
from test_rules_edgetpu import Q8
from test_rules_runtime import gelu_model, transpose_conv_model

from tflfuse.convert.optimize import optimize_bytes
from tflfuse.ir import flatbuffer
from tflfuse.targets import runtimes

INTERPRETERS = kit.installed()
KNOWN = [i for i in INTERPRETERS if i.name in runtimes.table().runtimes]
WANTED = ("tflite-runtime==2.7.0", "tflite-runtime==2.11.0", "tflite-runtime==2.14.0",
          "ai-edge-litert==2.3.0")  # fmt: skip


def by_name(names: tuple[str, ...]) -> list:
    """One param per wanted runtime: the installed interpreter, or a skip naming it."""
    found = {i.name: i for i in KNOWN}
    return [
        pytest.param(found.get(n), id=n, marks=() if n in found else pytest.mark.skip(
            reason=f"{n} is not installed (benchmarks/install_runtimes.py; {kit.ENV})"))
        for n in names
    ]  # fmt: skip


def all_known() -> list:
    extra = [i.name for i in KNOWN if i.name not in WANTED]
    return by_name((*WANTED, *extra))


# -- operator codes --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, tuple[str, int, int]]:
    """A model per (op, version): every builtin op of the schema, versions 1 .. one past the
    highest any release in the table registers."""
    folder = tmp_path_factory.mktemp("probes")
    table = runtimes.table()
    out = {}
    for op, code in sorted(flatbuffer.OP_CODES.items(), key=lambda kv: kv[1]):
        if op in ("CUSTOM", "PLACEHOLDER_FOR_GREATER_OP_CODES", "DELEGATE"):
            continue
        top = max(rt.top_version(op) for rt in table.runtimes.values())
        for version in range(1, max(top, len(table.since.get(op, ()))) + 2):
            path = folder / f"{op}.{version}.tflite"
            path.write_bytes(kit.opcode_probe(code, version))
            out[path] = (op, code, version)
    return out


@pytest.mark.parametrize("interp", all_known())
def test_the_interpreter_builds_exactly_the_op_versions_the_table_says(interp, probes) -> None:
    runtime = runtimes.resolve(interp.name)
    head, results = kit.try_models(interp, list(probes), construct_only=True)
    assert runtimes.version_key(head["version"]) == runtimes.version_key(runtime.version)
    wrong, words = [], []
    for r in results:
        op, code, version = probes[Path(r["model"])]
        predicted = runtimes.check_needs([runtimes.Need(op, code, version)], runtime)
        if predicted.runtime_ok != r["ok"]:
            wrong.append(f"{op} v{version}: predicted {predicted.runtime_ok}, real {r['ok']}")
        elif not r["ok"]:
            said = predicted.findings[0].reason.split(" (")[0]
            if not r["error"].startswith(said):
                words.append(f"{op} v{version}: {r['error']!r} vs {said!r}")
    assert len(results) == len(probes) > 500
    assert wrong == []
    assert words == []


# -- whole models: load, allocate, invoke --------------------------------------------------------
def conv_net() -> bytes:
    g = G()
    x = g.input((1, 8, 8, 3))
    y = g.conv(g.dwconv(g.conv(x, 8, 3, act="RELU6")), 4, 1)
    return g.bytes(g.op("MEAN", [y, g.const(np.array([1, 2], np.int32), "axes")], (1, 4)))


def int8_gelu_v1() -> bytes:
    """An int8 GELU whose version field says 1, as litert-quantizer writes it: int8 GELU came
    with v2 (TFLite 2.9); 2.8 resolves v1 and fails when the op runs."""
    g = Q8()
    x = g.input((1, 16))
    return g.bytes(g.op("GELU", [x], x.shape, 0.03, -20))


def edgetpu_op() -> bytes:
    g = G()
    x = g.input((1, 4))
    y = g.op("CUSTOM", [x], (1, 4))
    g.graph.ops[-1].custom_code = "edgetpu-custom-op"
    return g.bytes(y)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("matrix")
    made = {
        "conv_net": conv_net(),
        "gelu_erf": gelu_model(False),
        "gelu_erf_for_2.7": optimize_bytes(
            gelu_model(False), runtime="tflite-runtime==2.7.0", level=0
        ).data,
        "transpose_conv_relu6_v4": transpose_conv_model("RELU6", 4),
        "transpose_conv_for_2.7": optimize_bytes(
            transpose_conv_model("RELU6", 4), runtime="tflite-runtime==2.7.0", level=0
        ).data,
        "edgetpu_custom_op": edgetpu_op(),
        "gelu_int8_v1": int8_gelu_v1(),
    }
    paths = []
    for name, data in made.items():
        path = folder / f"{name}.tflite"
        path.write_bytes(data)
        paths.append(path)
    for sub in ("models/pytorch", "oracle/edgetpu"):
        paths += sorted((SHARED / sub).glob("*.tflite")) if (SHARED / sub).is_dir() else []
    return paths


@pytest.mark.parametrize("interp", all_known())
def test_models_run_exactly_where_predicted(interp, models) -> None:
    runtime = runtimes.resolve(interp.name)
    _, results = kit.try_models(interp, models)
    rows = []
    for r in results:
        predicted = runtimes.check(flatbuffer.load(r["model"]), runtime)
        rows.append((Path(r["model"]).name, predicted.runtime_ok, r["ok"], r["error"]))
    assert [row for row in rows if row[1] != row[2]] == []
    # the matrix is not vacuous: each runtime refuses the Edge TPU op, runs the conv net
    verdict = {name: real for name, _, real, _ in rows}
    assert verdict["conv_net.tflite"] and not verdict["edgetpu_custom_op.tflite"]
    assert verdict["gelu_erf_for_2.7.tflite"] and verdict["transpose_conv_for_2.7.tflite"]
    release = runtimes.version_key(runtime.version)
    tflite_runtime = runtime.family == "tflite-runtime"
    assert verdict["gelu_erf.tflite"] is not (tflite_runtime and release < (2, 8, 0))
    assert verdict["gelu_int8_v1.tflite"] is not (tflite_runtime and release < (2, 9, 0))
