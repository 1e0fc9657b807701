"""`tflfuse compare`: a conversion folder's three models side by side.

The folder here is built without TensorFlow: three small int8-free graphs written where
`tflfuse convert` writes its models, and a report.json with the fields `compare` reads. The
numbers that do not depend on the machine (ops, the Edge TPU mapping, the errors carried from the
report) are asserted exactly; latency only for being measured and compared with stock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from irgraphs import conv, model_of, to_bytes, unary

from tflfuse.convert import compare
from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph


def conv_relu(fused: bool) -> bytes:
    g = Graph("main")
    x = g.add_tensor("x", (1, 8, 8, 3))
    c = conv(g, x, 4, act="RELU" if fused else "NONE")
    y = c.output if fused else unary(g, "RELU", c.output).output
    return to_bytes(model_of(g, [x], [y]))


REPORT = {
    "source": "tiny.keras",
    "recipe": {"name": "cpu-float", "input_type": "float32", "output_type": "float32"},
    "quantization": {"mode": "float"},
    "files": {"fused": "model.tflite", "unfused": "model_unfused.tflite", "stock": "s.tflite"},
    "agreement": {
        k: {
            "samples": 16,
            "max_abs": err,
            "outputs": [{"max_abs": err, "mean_abs": err / 10, "reference_range": 2.5}],
        }
        for k, err in (("fused", 1e-6), ("unfused", 2e-6), ("stock", 0.5))
    },
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.tflite").write_bytes(conv_relu(fused=True))
    (out / "model_unfused.tflite").write_bytes(conv_relu(fused=False))
    (out / "s.tflite").write_bytes(conv_relu(fused=False))
    (out / "report.json").write_text(json.dumps(REPORT))
    return out


def test_compare_reads_the_models_and_times_them_together(folder: Path) -> None:
    result = compare.compare(folder, runs=5, warmup=1, progress=False)
    rows = {r["model"]: r for r in result["rows"]}
    assert [r["model"] for r in result["rows"]] == ["unfused", "stock", "fused"]
    assert {k: r["ops"] for k, r in rows.items()} == {"unfused": 2, "stock": 2, "fused": 1}
    # float ops: the Edge TPU maps none of them (it takes int8 only)
    assert {k: (r["edgetpu_mapped"], r["edgetpu_ops"]) for k, r in rows.items()} == {
        "unfused": (0, 2),
        "stock": (0, 2),
        "fused": (0, 1),
    }
    assert rows["stock"]["max_abs_error"] == 0.5 and rows["fused"]["mean_abs_error"] == 1e-7
    assert rows["stock"]["p50_vs_stock"] == 1.0
    assert all(r["p50_ms"] > 0 for r in rows.values())
    names = [m["name"] for m in result["benchmark"]["models"]]
    assert names == ["unfused", "stock", "fused"]
    assert result["benchmark"]["protocol"]["order"] == "interleaved"
    table = compare.format_table(result)
    assert "tiny.keras: recipe cpu-float (float, float32 -> float32)" in table
    assert "0 / 1" in table and "0.5000" in table and "1.0e-06" in table
    assert "(its outputs span 2.5)" in table


def test_an_undecided_edgetpu_mapping_is_marked_and_explained(folder: Path) -> None:
    """Where the evidence cannot decide the compiler's placement (a refused op near the input),
    the table marks the count and gives the other reading's under it."""
    result = compare.compare(folder, runs=3, warmup=1, progress=False)
    stock = next(r for r in result["rows"] if r["model"] == "stock")
    assert stock["edgetpu_other_readings"] == []  # float models: nothing undecided
    stock["edgetpu_other_readings"] = [{"ops": [1], "mapped": 2, "reading": "op 1 ... undecided"}]
    table = compare.format_table(result)
    assert "0 / 2*" in table and "*: the evidence cannot decide:" in table
    assert "stock: or 2 / 2: op 1 ... undecided." in table


def test_a_folder_that_is_not_a_conversion_is_one_line(tmp_path: Path, folder: Path) -> None:
    with pytest.raises(TflfuseError, match="no such folder"):
        compare.read_conversion(tmp_path / "nowhere")
    with pytest.raises(TflfuseError, match=r"no report\.json"):
        compare.read_conversion(tmp_path)
    (folder / "s.tflite").unlink()
    with pytest.raises(TflfuseError, match="the stock model is missing"):
        compare.read_conversion(folder)
    (folder / "report.json").write_text("{not json")
    with pytest.raises(TflfuseError, match="cannot read the report"):
        compare.read_conversion(folder)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tflfuse.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_prints_the_table_and_writes_json_and_plot(folder: Path) -> None:
    pytest.importorskip("matplotlib")
    plot, out = folder / "latency.png", folder / "compare.json"
    done = _cli("compare", str(folder), "--runs", "5", "--plot", str(plot), "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "Edge TPU mapped" in done.stdout and "fused" in done.stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert [r["ops"] for r in json.loads(out.read_text())["rows"]] == [2, 2, 1]


def test_cli_refuses_to_overwrite_a_model_and_bad_folders(folder: Path) -> None:
    done = _cli("compare", str(folder), "--runs", "2", "--plot", str(folder / "model.tflite"))
    assert done.returncode == 2 and "would overwrite a model" in done.stderr
    assert (folder / "model.tflite").read_bytes()[4:8] == b"TFL3"
    done = _cli("compare", str(folder / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no such folder" in done.stderr


def _with_manifest(folder: Path) -> None:
    """The manifest `convert` writes: every file's SHA-256."""
    import hashlib

    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    text = json.dumps({"format": 1, "tflfuse": "test", "files": files})
    (folder / ".tflfuse-manifest.json").write_text(text)


def test_a_file_changed_since_convert_is_refused_naming_it(folder: Path) -> None:
    """`compare OUT` after model.tflite was replaced mixed the new file's ops and latency with
    the old report's errors, without a word."""
    _with_manifest(folder)
    result = compare.compare(folder, runs=2, warmup=0, progress=False)
    assert result["files_checked"] is True
    (folder / "model.tflite").write_bytes(conv_relu(fused=False))  # another model in its place
    with pytest.raises(TflfuseError, match=r"out: model\.tflite changed since tflfuse convert"):
        compare.read_conversion(folder)
    (folder / "report.json").write_text(json.dumps({**REPORT, "source": "other.keras"}))
    with pytest.raises(TflfuseError, match=r"report\.json, model\.tflite changed .* them"):
        compare.read_conversion(folder)


def test_a_folder_without_a_manifest_is_compared_and_says_so(folder: Path) -> None:
    result = compare.compare(folder, runs=2, warmup=0, progress=False)
    assert result["files_checked"] is False
    assert "files: not checked against the conversion" in compare.format_table(result)


def test_json_before_the_folder_takes_the_folder_as_the_operand(folder: Path) -> None:
    """`compare --json DIR` took DIR for the JSON's destination."""
    done = _cli("compare", "--json", str(folder), "--runs", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert [r["ops"] for r in json.loads(done.stdout)["rows"]] == [2, 2, 1]
