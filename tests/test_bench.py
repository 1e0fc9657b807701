"""`tflfuse bench` and the shared timing protocol: structure, interleaving, statistics, arena
estimate, runtime delegate errors. Nothing here asserts a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import oracle_models, wheel_models
from irgraphs import conv, model_of, to_bytes

from tflfuse.device import bench
from tflfuse.device import interpreter as runtime
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, flatbuffer

SIZE = 1 * 16 * 16 * 8 * 4  # bytes of one float32 [1, 16, 16, 8] activation


def _chain(n: int) -> bytes:
    g = Graph()
    x = g.add_tensor("x", (1, 16, 16, 8))
    y = x
    for i in range(n):
        y = conv(g, y, 8, act="RELU", name=f"c{i}").outputs[0]
    return to_bytes(model_of(g, [x], [y]))


def _siblings() -> bytes:
    """x feeds three convs whose outputs are all alive at once (concatenated)."""
    g = Graph()
    x = g.add_tensor("x", (1, 16, 16, 8))
    branches = [conv(g, x, 8, name=f"b{i}").outputs[0] for i in range(3)]
    y = g.add_tensor("cat", (1, 16, 16, 24))
    g.add_op("CONCATENATION", branches, [y], {"axis": 3, "fused_activation_function": "NONE"})
    return to_bytes(model_of(g, [x], [y]))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bench")
    out = {}
    for name, data in (("chain2", _chain(2)), ("chain5", _chain(5)), ("wide", _siblings())):
        path = folder / f"{name}.tflite"
        path.write_bytes(data)
        out[name] = path
    return out


def test_plan_arena_reuses_memory_of_dead_tensors() -> None:
    lifetimes = {0: (0, 0), 1: (0, 1), 2: (1, 2), 3: (2, 3)}
    assert bench.plan_arena(dict.fromkeys(lifetimes, 640), lifetimes) == 1280
    all_alive = dict.fromkeys(lifetimes, (0, 3))
    assert bench.plan_arena(dict.fromkeys(lifetimes, 640), all_alive) == 2560
    assert bench.plan_arena({0: 1}, {0: (0, 0)}) == bench.ALIGNMENT


def test_static_facts_count_ops_and_estimate_the_arena(models) -> None:
    chain2, chain5 = bench.static_facts(models["chain2"]), bench.static_facts(models["chain5"])
    assert chain2["op_count"] == 2 and chain5["op_count"] == 5
    assert chain5["op_counts"] == {"CONV_2D": 5}
    # a chain needs two live activations whatever its length; siblings need all of them at once
    assert chain2["arena_bytes_estimate"] == chain5["arena_bytes_estimate"] == 2 * SIZE
    wide = bench.static_facts(models["wide"])
    # at the concatenation its three inputs (S each) and its output (3S) are alive together
    assert wide["arena_bytes_estimate"] == 6 * SIZE


def test_static_facts_match_the_flatbuffer_for_real_models() -> None:
    paths = wheel_models("pymicro-wakeword")[:1] + oracle_models(compiled=False)[:2]
    if not paths:
        pytest.skip("no shipped .tflite models here")
    for path in paths:
        facts = bench.static_facts(path)
        assert facts["op_count"] == len(flatbuffer.load(path).subgraphs[0].ops), path


def test_run_benchmark_interleaves_models_and_reports_statistics(models, monkeypatch) -> None:
    calls: list[str] = []
    real = bench.make_interpreter

    class Recording:
        def __init__(self, inner, name: str) -> None:
            self._inner, self._name = inner, name

        def invoke(self) -> None:
            calls.append(self._name)
            self._inner.invoke()

        def __getattr__(self, attr: str):
            return getattr(self._inner, attr)

    def recording(model, delegate="xnnpack", threads=None):
        return Recording(real(model, delegate, threads), Path(model).stem)

    monkeypatch.setattr(bench, "make_interpreter", recording)
    order = [models["chain5"], models["chain2"], models["wide"]]
    result = bench.run_benchmark(order, runs=7, warmup=2, threads=1, progress=False)

    names = ["chain5", "chain2", "wide"]
    assert calls[:3] == names  # the first inferences
    assert calls[3:] == names * 9  # then A B C A B C ... for warm-up and timed rounds
    assert result["protocol"]["order"] == "interleaved"
    assert result["protocol"]["runs"] == 7 and result["protocol"]["threads"] == 1
    for m in result["models"]:
        lat = m["latency_ms"]
        assert len(m["samples_ms"]) == 7
        assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
        assert lat["jitter"] == pytest.approx(lat["p99"] - lat["p50"])
        assert m["init_ms"] > 0 and m["first_invoke_ms"] > 0
    first, second = result["models"][:2]
    assert first["ratio_to_first"]["p50"] == 1.0
    assert second["ratio_to_first"]["op_count"] == pytest.approx(2 / 5)
    assert second["ratio_to_first"]["p50"] == pytest.approx(
        second["latency_ms"]["p50"] / first["latency_ms"]["p50"]
    )
    assert result["environment"]["interpreter"].startswith(("ai_edge_litert", "tflite_runtime"))
    json.dumps(result)  # JSON-ready


def test_models_with_one_signature_get_the_same_inputs(models) -> None:
    a = runtime.make_interpreter(models["chain2"]).get_input_details()
    b = runtime.make_interpreter(models["chain5"]).get_input_details()
    va, vb = bench.seeded_input_values(a, 3), bench.seeded_input_values(b, 3)
    assert np.array_equal(va[0], vb[0])
    assert not np.array_equal(va[0], bench.seeded_input_values(a, 4)[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runs": 0}, "runs must be at least 1"),
        ({"delegate": "tpu9000"}, "unknown delegate"),
        ({"delegate": "external:/no/such/delegate.so"}, "does not exist"),
        ({"delegate": "edgetpu"}, "edgetpu delegate"),
    ],
)
def test_bad_requests_are_one_line_errors(models, kwargs, message) -> None:
    if kwargs.get("delegate") == "edgetpu" and runtime._loadable("libedgetpu.so.1") is None:
        pytest.skip("an Edge TPU runtime is installed here")
    with pytest.raises(TflfuseError, match=message) as info:
        bench.run_benchmark(
            [models["chain2"]], **{"runs": 2, "warmup": 0, "progress": False, **kwargs}
        )
    assert "\n" not in str(info.value)


def test_cli_writes_json_and_plot(models, tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    cmd = [sys.executable, "-m", "tflfuse.cli", "bench", str(models["chain2"]), str(models["wide"])]
    cmd += ["--runs", "5", "--warmup", "1", "--delegate", "none", "--json", str(out)]
    cmd += ["--plot", str(png), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [m["name"] for m in result["models"]] == ["chain2.tflite", "wide.tflite"]
    assert result["protocol"]["delegate"] == "none"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "p50" in proc.stdout and "chain2.tflite" in proc.stdout


def test_cli_missing_model_exits_2_with_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tflfuse.cli", "bench", str(tmp_path / "absent.tflite")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such model file" in proc.stderr


def test_cpu_delegates_compute_the_same_function(models) -> None:
    data = models["chain5"].read_bytes()
    outputs = {}
    for delegate in ("xnnpack", "none", "ref"):
        interp = runtime.make_interpreter(data, delegate=delegate, threads=1)
        detail = interp.get_input_details()[0]
        interp.set_tensor(detail["index"], bench.seeded_input_values([detail], 5)[0])
        interp.invoke()
        outputs[delegate] = interp.get_tensor(interp.get_output_details()[0]["index"]).copy()
    assert np.std(outputs["ref"]) > 0
    np.testing.assert_allclose(outputs["xnnpack"], outputs["ref"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outputs["none"], outputs["ref"], rtol=1e-4, atol=1e-4)


def test_missing_gpu_delegate_is_one_line(models) -> None:
    if any(runtime._loadable(lib) is None for lib in runtime._GPU_LIBRARIES):
        pytest.skip("a GPU delegate library is installed here")
    with pytest.raises(TflfuseError, match="no GPU delegate library found") as info:
        runtime.make_interpreter(models["chain2"], delegate="gpu")
    assert "\n" not in str(info.value)
