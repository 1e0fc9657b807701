"""The edgetpu_compiler wrapper: the log parser on texts in the compiler's format, and the wrapper
end to end with a stand-in `edgetpu_compiler` on PATH.

The log texts below are reconstructions written from the documented format (Coral's compiler
page and logs users posted in google-coral/edgetpu issues, e.g. #512, #659, #686), not copies of
a particular run. The stand-in compiler is faithful where it matters: for a Coral oracle model it
returns the real compiler's output (the `_edgetpu` twin) and derives its log from that twin; with
`-a` (several Edge TPU subgraphs, which no shareable twin was compiled with) it compiles chain
models by a stated rule, one custom op per run of mapped ops, and writes the table as real `-a`
logs look (no "More than one subgraph" rows, custom ops listed as CUSTOM).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from conftest import ORACLE, needs_oracle, oracle_models

from tflfuse.cli import main
from tflfuse.errors import TflfuseError
from tflfuse.targets import capability
from tflfuse.targets.edgetpu import compiler as edgetpu_compiler
from tflfuse.targets.edgetpu.compiler import compile_model
from tflfuse.targets.edgetpu.compiler_log import memory_bytes, parse_log

STATUS = capability("edgetpu")["status"]

CONSOLE_V16 = """\
Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 1742 ms.

Input model: detector_int8.tflite
Input size: 3.12MiB
Output model: detector_int8_edgetpu.tflite
Output size: 3.41MiB
On-chip memory used for caching model parameters: 2.95MiB
On-chip memory remaining for caching model parameters: 4.72MiB
Off-chip memory used for streaming uncached model parameters: 0.00B
Number of Edge TPU subgraphs: 1
Total number of operations: 71
Operation log: detector_int8_edgetpu.log

Model successfully compiled but not all operations are supported by the Edge TPU. A percentage of \
the model will instead run on the CPU, which is slower. If possible, consider updating your model \
to use only operations supported by the Edge TPU. For details, visit g.co/coral/model-reqs.
Number of operations that will run on Edge TPU: 58
Number of operations that will run on CPU: 13

Operator                       Count      Status

CONV_2D                        40         Mapped to Edge TPU
DEPTHWISE_CONV_2D              13         Mapped to Edge TPU
QUANTIZE                       1          Mapped to Edge TPU
ADD                            4          Mapped to Edge TPU
LEAKY_RELU                     1          Operation not supported
CONV_2D                        6          More than one subgraph is not supported
RESIZE_NEAREST_NEIGHBOR        1          Operation version not supported
MEAN                           1          Operation is otherwise supported, but not mapped due to some unspecified limitation
DEQUANTIZE                     1          Operation is working on an unsupported data type
CONCATENATION                  3          More than one subgraph is not supported
"""  # noqa: E501

LOG_FILE_V15 = """\
Edge TPU Compiler version 15.0.340273435
Input: unet_quant.tflite
Output: unet_quant_edgetpu.tflite

Operator                       Count      Status

CONV_2D                        18         Mapped to Edge TPU
MAX_POOL_2D                    3          Mapped to Edge TPU
RESIZE_BILINEAR                1          Operation is otherwise supported, but not mapped due to some unspecified limitation
CONCATENATION                  3          More than one subgraph is not supported
"""  # noqa: E501


def test_the_rank_status_is_a_known_one() -> None:
    """The status compiler 16 gives the DEQUANTIZE of an fp16 model's [O, kh, kw, I] filters."""
    log = parse_log(
        "Edge TPU Compiler version 16.0.384591198\n\nOperator  Count  Status\n\n"
        "DEQUANTIZE  60  Tensor has unsupported rank (up to 3 innermost dimensions mapped)\n"
    )
    assert log.rows == [("DEQUANTIZE", 60, STATUS["rank"])] and log.cpu == 60
    assert not any("unknown status" in m for m in log.messages)


def test_console_header_and_table_are_parsed() -> None:
    log = parse_log(CONSOLE_V16)
    h = log.header
    assert h["version"] == "16.0.384591198"
    assert h["input_model"] == "detector_int8.tflite"
    assert h["output_model"] == "detector_int8_edgetpu.tflite"
    assert h["on_chip_memory_bytes"] == round(2.95 * 2**20)
    assert h["off_chip_memory_bytes"] == 0
    assert (h["edgetpu_subgraphs"], h["total_ops"]) == (1, 71)
    assert (h["ops_on_edgetpu"], h["ops_on_cpu"]) == (58, 13)
    assert len(log.rows) == 10
    # every status string of the sample (the table also knows the split status of -a compiles
    # and the rank status of an fp16 model's filters, `test_the_rank_status_is_a_known_one`)
    shown = set(STATUS.values()) - {STATUS["first_dimension"], STATUS["rank"]}
    assert {s for _, _, s in log.rows} == shown
    assert (log.mapped, log.cpu) == (58, 13)
    assert log.mapped + log.cpu == h["total_ops"]
    assert not any("unknown status" in m for m in log.messages)


def test_log_file_format_is_parsed_too() -> None:
    log = parse_log(LOG_FILE_V15)
    assert log.header["input_model"] == "unet_quant.tflite"
    assert log.header["output_model"] == "unet_quant_edgetpu.tflite"
    assert log.rows[2] == ("RESIZE_BILINEAR", 1, STATUS["limitation"])
    assert (log.mapped, log.cpu) == (21, 4)


def test_unknown_status_is_reported() -> None:
    text = "Operator                       Count      Status\n\nFOO  2  Something new happened\n"
    log = parse_log(text)
    assert log.rows == [("FOO", 2, "Something new happened")]
    assert any("unknown status" in m for m in log.messages)


def test_memory_units() -> None:
    assert memory_bytes("0.00B") == 0
    assert memory_bytes("512.00KiB") == 512 * 1024
    assert memory_bytes("7.75MiB") == round(7.75 * 2**20)
    assert memory_bytes("lots") is None


# -- without the compiler --------------------------------------------------------------------------
def test_without_the_compiler_one_line_says_where_it_comes_from(
    tmp_path: Path,
    tiny_tflite: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TflfuseError) as err:
        edgetpu_compiler.find_compiler()
    assert "Coral's package repository" in str(err.value)
    assert "tflfuse check" in str(err.value)
    assert main(["compile", str(tiny_tflite), "--target", "edgetpu"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "x86-64" in out.err
    # a model that is not there is the model's fault, not the compiler's
    assert main(["compile", str(tmp_path / "missing.tflite"), "--target", "edgetpu"]) == 2
    err_line = capsys.readouterr().err
    assert "missing.tflite: " in err_line and "edgetpu_compiler" not in err_line


# -- with a stand-in compiler ----------------------------------------------------------------------
STAND_IN = '''\
#!{python}
"""Stand-in for Coral's edgetpu_compiler (tests only): writes a compiled model and a log in the
compiler's format. For an oracle model compiled in the default mode the compiled model is the real
compiler's twin (those twins were compiled without -a). Otherwise a simple rule places the ops:
op types outside Coral's documented op table (CPU_ONLY) stay on the CPU; in the default mode the
first of them and every op after it stay on the CPU (one Edge TPU subgraph); with -a every other
op maps and each run of mapped ops between CPU ops becomes one edgetpu-custom-op (exact for the
chain models the tests compile). As in real logs, custom ops are listed as CUSTOM and an -a
compile has no "More than one subgraph is not supported" rows."""
import argparse, os, shutil, sys
from pathlib import Path
from tflfuse.ir import flatbuffer

CPU_ONLY = ("CUSTOM", "ARG_MAX", "GATHER")
MAPPED = "Mapped to Edge TPU"
LIMITED = "Operation is otherwise supported, but not mapped due to some unspecified limitation"
ap = argparse.ArgumentParser()
ap.add_argument("-s", "--show_operations", action="store_true")
ap.add_argument("-o", "--out_dir", default=".")
ap.add_argument("-n", "--num_segments", type=int, default=1)
ap.add_argument("-a", "--enable_multiple_subgraphs", action="store_true")
ap.add_argument("--search_delegate", action="store_true")
ap.add_argument("model")
a = ap.parse_args()
Path(os.environ["STANDIN_ARGV"]).write_text(" ".join(sys.argv[1:]))
src, out = Path(a.model), Path(a.out_dir)
cpu = flatbuffer.load(src)


def rule_compile(model, several):
    g = model.main
    on_cpu = [op.type in CPU_ONLY for op in g.ops]
    if not several:
        first = next((i for i, c in enumerate(on_cpu) if c), len(on_cpu))
        on_cpu = [i >= first for i in range(len(on_cpu))]
    runs, run = [], []
    for op, c in zip(list(g.ops), on_cpu):
        if c and run:
            runs.append(run)
            run = []
        elif not c:
            run.append(op)
    runs += [run] if run else []
    for run in runs:
        made = {{t for op in run for t in op.outputs}}
        ins = [t for t in dict.fromkeys(t for op in run for t in op.inputs)
               if t is not None and not t.is_constant and t not in made]
        outs = [t for t in dict.fromkeys(t for op in run for t in op.outputs)
                if g.is_graph_output(t) or any(c not in run for c in t.consumers)]
        at = g.ops.index(run[0])
        for op in run:
            g.remove_op(op)
        seg = g.add_op("CUSTOM", ins, outs, custom_code="edgetpu-custom-op")
        g.ops.remove(seg)
        g.ops.insert(at, seg)
    return model


twin = Path(os.environ.get("STANDIN_TWINS", "/nonexistent")) / f"{{src.stem}}_edgetpu.tflite"
if twin.exists() and not a.enable_multiple_subgraphs:
    data = twin.read_bytes()
else:
    data = flatbuffer.to_bytes(rule_compile(flatbuffer.load(src), a.enable_multiple_subgraphs))
compiled = flatbuffer.from_bytes(data)
segments = sum(1 for op in compiled.main.ops if op.custom_code == "edgetpu-custom-op")
left = {{t.name for op in compiled.main.ops if op.custom_code != "edgetpu-custom-op"
         for t in op.outputs}}
counts, first = {{}}, True  # one row per (op, status), as in real tables
for op in cpu.main.ops:
    if not all(t.name in left for t in op.outputs):
        status = MAPPED
    elif op.type in CPU_ONLY:
        status, first = "Operation not supported", False
    elif first:
        status, first = LIMITED, False
    else:
        status = "More than one subgraph is not supported"
    counts[(op.type, status)] = counts.get((op.type, status), 0) + 1
rows = [(op, n, s) for (op, s), n in counts.items()]
on_tpu = sum(n for _, n, s in rows if s == MAPPED)
names = [f"{{src.stem}}_edgetpu.tflite"]
if a.num_segments > 1:
    names = [f"{{src.stem}}_segment_{{i}}_of_{{a.num_segments}}_edgetpu.tflite"
             for i in range(a.num_segments)]
for n in names:
    (out / n).write_bytes(data)
table = "Operator                       Count      Status\\n\\n" + "".join(
    f"{{op:<30}} {{n:<10}} {{s}}\\n" for op, n, s in rows)
print("Edge TPU Compiler version 16.0.384591198")
print("Started a compilation timeout timer of 180 seconds.\\n")
print("Model compiled successfully in 812 ms.\\n")
print(f"Input model: {{src}}\\nInput size: 0.52MiB\\nOutput model: {{out / names[0]}}")
print("Output size: 0.61MiB")
print("On-chip memory used for caching model parameters: 0.50MiB")
print("On-chip memory remaining for caching model parameters: 7.25MiB")
print("Off-chip memory used for streaming uncached model parameters: 0.00B")
print(f"Number of Edge TPU subgraphs: {{segments}}")
print(f"Total number of operations: {{len(cpu.main.ops)}}")
print(f"Operation log: {{out / (src.stem + '_edgetpu.log')}}\\n")
print(f"Number of operations that will run on Edge TPU: {{on_tpu}}")
print(f"Number of operations that will run on CPU: {{len(cpu.main.ops) - on_tpu}}\\n")
print(table)
(out / f"{{src.stem}}_edgetpu.log").write_text(
    f"Edge TPU Compiler version 16.0.384591198\\nInput: {{src}}\\nOutput: {{out / names[0]}}\\n\\n"
    + table)
'''


@pytest.fixture()
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "edgetpu_compiler"
    script.write_text(STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("STANDIN_TWINS", str(ORACLE))
    monkeypatch.setenv("STANDIN_ARGV", str(tmp_path / "argv.txt"))
    return tmp_path


@needs_oracle()
@pytest.mark.parametrize("cpu_model", oracle_models(compiled=False), ids=lambda p: p.stem)
def test_wrapper_runs_parses_and_agrees_with_the_prediction(stand_in: Path, cpu_model) -> None:
    out = stand_in / "out"
    result = compile_model(cpu_model, out)
    assert result.outputs == [out / f"{cpu_model.stem}_edgetpu.tflite"]
    assert result.console.is_file() and "Operator" in result.console.read_text()
    assert (out / f"{cpu_model.stem}_edgetpu.log").is_file()
    assert result.actual is not None
    assert result.actual.cpu_ops() == result.prediction.cpu_ops()
    assert result.agrees()
    assert result.log.mapped == result.prediction.mapped
    assert "-s" in (stand_in / "argv.txt").read_text().split()


@needs_oracle()
def test_compile_cli_prints_prediction_against_actual(
    stand_in: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ORACLE / "deeplabv3_mnv2_dm05_pascal_quant.tflite"
    out = stand_in / "out"
    assert main(["compile", str(model), "--target", "edgetpu", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mapped to Edge TPU: predicted 64, actual 64" in text
    assert "prediction and compiler agree" in text
    assert main(["compile", str(model), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["agrees"] is True
    assert report["compiler"]["header"]["version"] == "16.0.384591198"
    assert report["actual"]["cpu"] == 8


@needs_oracle()
def test_segments_and_delegate_search_reach_the_compiler(stand_in: Path) -> None:
    model = ORACLE / "mobilenet_v1_0.25_128_quant.tflite"
    result = compile_model(model, stand_in / "seg", num_segments=2, search_delegate=True)
    argv = (stand_in / "argv.txt").read_text().split()
    assert argv[argv.index("-n") + 1] == "2" and "--search_delegate" in argv
    assert [p.name for p in result.outputs] == [
        f"{model.stem}_segment_{i}_of_2_edgetpu.tflite" for i in range(2)
    ]
    assert result.actual is None and result.agrees()


def test_a_model_the_stand_in_maps_entirely(stand_in: Path) -> None:
    """Without ../shared: a tiny uint8 model, compiled to one custom op."""
    import numpy as np

    from tflfuse.ir import Graph, Model, Quantization, flatbuffer

    qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x = g.add_tensor("x", (1, 4, 4, 2), "UINT8", quantization=qp)
    y = g.add_tensor("y", (1, 4, 4, 2), "UINT8", quantization=qp)
    g.add_op("RELU", [x], [y])
    g.inputs, g.outputs = [x], [y]
    path = stand_in / "tiny.tflite"
    flatbuffer.save(Model([g]), path)
    result = compile_model(path, stand_in / "tiny_out")
    assert (result.prediction.mapped, result.log.mapped, result.actual.mapped) == (1, 1, 1)


# -- several Edge TPU subgraphs (-a) and the per-op-type status table -----------------------------
def _chain_with_a_custom_op(folder: Path) -> Path:
    """uint8 x -> RELU -> CUSTOM "MyOp" -> RELU: one Edge TPU subgraph maps the first RELU only;
    with -a both RELUs map, as two segments around the custom op."""
    import numpy as np

    from tflfuse.ir import Graph, Model, Quantization, flatbuffer

    qp = Quantization(scale=np.array([0.1], np.float32), zero_point=np.array([0], np.int64))
    g = Graph("main")
    x, a, b, y = (g.add_tensor(n, (1, 4, 4, 2), "UINT8", quantization=qp) for n in "xaby")
    g.add_op("RELU", [x], [a])
    g.add_op("CUSTOM", [a], [b], custom_code="MyOp")
    g.add_op("RELU", [b], [y])
    g.inputs, g.outputs = [x], [y]
    path = folder / "chain.tflite"
    flatbuffer.save(Model([g]), path)
    return path


def test_multiple_subgraphs_reach_the_compiler_and_segments_are_compared(stand_in: Path) -> None:
    from dataclasses import replace

    model = _chain_with_a_custom_op(stand_in)
    one = compile_model(model, stand_in / "one")
    assert "-a" not in (stand_in / "argv.txt").read_text().split()
    assert (one.prediction.cpu_ops(), one.actual.cpu_ops()) == ([1, 2], [1, 2])
    assert (one.predicted_segments, one.actual_segments) == (1, 1) and one.agrees()

    several = compile_model(model, stand_in / "several", multiple_subgraphs=True)
    assert "-a" in (stand_in / "argv.txt").read_text().split()
    assert several.log.header["edgetpu_subgraphs"] == 2  # the console's count
    assert several.truth.segments == 2  # edgetpu-custom-ops in the twin
    assert (several.prediction.cpu_ops(), several.actual.cpu_ops()) == ([1], [1])
    assert (several.predicted_segments, several.actual_segments) == (2, 2) and several.agrees()
    assert STATUS["after_cut"] not in {s for _, _, s in several.log.rows}
    # the same CPU ops but a different number of segments is a disagreement in this mode
    merged = replace(several, prediction=replace(several.prediction, segments=1))
    assert not merged.agrees()
    # the one-subgraph prediction against the -a compile disagrees on the placement too
    assert not replace(several, prediction=one.prediction).agrees()


def test_status_table_names_ops_as_the_log_does_and_marks_differences(stand_in: Path) -> None:
    from dataclasses import replace

    model = _chain_with_a_custom_op(stand_in)
    several = compile_model(model, stand_in / "several", multiple_subgraphs=True)
    # the log lists the custom op as CUSTOM (as real logs do), the prediction calls it MyOp
    assert ("CUSTOM", 1, STATUS["unsupported"]) in several.log.rows
    assert several.actual.ops[1].status == STATUS["unsupported"]
    assert several.status_agreement() == (3, 3)
    rows = several.comparison()
    assert ("CUSTOM", STATUS["unsupported"], 1, 1) in rows
    assert ("RELU", STATUS["mapped"], 2, 2) in rows and len(rows) == 2
    text = edgetpu_compiler.format_comparison(several)
    assert "statuses: 3 of 3 logged ops have the predicted status" in text
    assert "Edge TPU segments:  predicted 2, actual 2" in text and "*" not in text

    wrong = replace(several, prediction=compile_model(model, stand_in / "one").prediction)
    assert wrong.status_agreement() == (2, 3)
    text = edgetpu_compiler.format_comparison(wrong)
    starred = {ln.split()[1:4][0] for ln in text.splitlines() if ln.startswith("* ")}
    assert starred == {"RELU"}
    assert "prediction and compiler DISAGREE" in text


def test_compile_cli_multiple_subgraphs(stand_in: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _chain_with_a_custom_op(stand_in)
    out = stand_in / "out"
    args = ["compile", str(model), "--target", "edgetpu", "-o", str(out), "--multiple-subgraphs"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "-a (several Edge TPU subgraphs allowed)" in text
    assert "mapped to Edge TPU: predicted 2, actual 2" in text
    assert "prediction and compiler agree" in text
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["multiple_subgraphs"] is True
    assert report["segments"] == {"predicted": 2, "actual": 2}
    assert report["actual"]["segments"] == 2 and report["status_agreement"] == [3, 3]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "via-tflfuse"])
def test_compile_script_passes_multiple_subgraphs(stand_in: Path, direct: bool) -> None:
    import subprocess

    model = _chain_with_a_custom_op(stand_in)
    script = Path(__file__).resolve().parents[1] / "device_scripts" / "compile_edgetpu.py"
    out = stand_in / "script_out"
    cmd = [sys.executable, str(script), str(model), "-o", str(out), "--multiple-subgraphs"]
    proc = subprocess.run([*cmd, *(["--direct"] if direct else [])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    argv = (stand_in / "argv.txt").read_text().split()
    assert "-a" in argv and argv[-1] == str(model)
    log = (out / "chain_compile.log").read_text()
    if direct:  # the compiler's own console output
        assert "Number of Edge TPU subgraphs: 2" in log
    else:  # tflfuse compile's comparison
        assert "Edge TPU segments:  predicted 2, actual 2" in log
        assert "prediction and compiler agree" in log
