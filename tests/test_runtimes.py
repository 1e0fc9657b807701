"""The runtime table (delegates/runtimes.toml) and `tflfuse check --runtime`, without any
interpreter: the data is whole and cited, the check reads what a model's operator codes say, and
the CLI answers in one line, fast, with nothing but tflfuse. Real interpreters check the table in
tests/test_runtimes_probe.py."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rulekit import G
from runtime_kit import SHARED

from tflfuse.cli import main
from tflfuse.errors import UsageError
from tflfuse.ir import flatbuffer
from tflfuse.targets import runtimes

PYTORCH = SHARED / "models" / "pytorch"
COMMIT = 40


def gelu_bytes(version: int = 1) -> bytes:
    g = G()
    x = g.input((1, 8))
    y = g.op("GELU", [g.fc(x, 8)], (1, 8), approximate=False)
    g.graph.ops[-1].version = version
    return g.bytes(y)


# -- the table -----------------------------------------------------------------------------------
def test_every_runtime_cites_a_file_at_a_commit() -> None:
    table = runtimes.table()
    assert len(table.runtimes) >= 40
    for rt in table.runtimes.values():
        assert rt.source["repo"] == "google-ai-edge/LiteRT"
        assert len(rt.source["commit"]) == COMMIT and rt.source["file"].endswith(".cc")
        assert rt.basis in ("runtime_version", "register")
    families = {rt.family for rt in table.runtimes.values()}
    assert families == set(runtimes.FAMILIES)
    for name in ("tflite-runtime==2.5.0", "tflite-runtime==2.14.0", "tensorflow==2.21.0",
                 "ai-edge-litert==1.4.0", "ai-edge-litert==2.3.0"):  # fmt: skip
        assert name in table.runtimes


def test_builtin_codes_agree_with_the_schema_tflfuse_reads() -> None:
    table = runtimes.table()
    for op, code in table.codes.items():
        assert flatbuffer.OP_CODES[op] == code, op


def test_releases_only_gain_op_versions() -> None:
    """Within a family a later release registers every op version an earlier one does (the
    data would otherwise say a model stops running when the device is upgraded)."""
    table = runtimes.table()
    for family in runtimes.FAMILIES:
        releases = table.family(family)
        for older, newer in itertools.pairwise(releases):
            for op, versions in older.versions.items():
                assert set(versions) <= set(newer.versions.get(op, ())), (
                    older.name,
                    newer.name,
                    op,
                )


def test_measured_corrections_override_runtime_version_cc() -> None:
    table = runtimes.table()
    assert table.since["GELU"][0] == "2.8.0"  # runtime_version.cc says 2.9.0; 2.8.0 has it
    assert 1 in table.runtimes["tflite-runtime==2.8.0"].versions["GELU"]
    assert "GELU" not in table.runtimes["tflite-runtime==2.7.0"].versions
    assert table.runtimes["tflite-runtime==2.11.0"].top_version("CONV_2D") == 6  # not 7


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("tflite-runtime==2.5.0", "tflite-runtime==2.5.0"),
        ("tflite_runtime==2.5.0.post1", "tflite-runtime==2.5.0"),
        ("tflite-runtime 2.11", "tflite-runtime==2.11.0"),
        ("ai-edge-litert==2.3", "ai-edge-litert==2.3.0"),
        ("tensorflow==2.21", "tensorflow==2.21.0"),
    ],
)
def test_runtime_names_as_pip_spells_them(spec: str, name: str) -> None:
    assert runtimes.resolve(spec).name == name


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tflite-runtime==2.4.0", "no data for that tflite-runtime release (known: 2.5.0"),
        ("onnxruntime==1.0", "is not PACKAGE==VERSION"),
        ("2.5", "is not PACKAGE==VERSION"),
    ],
)
def test_an_unknown_runtime_is_one_line(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        runtimes.resolve(spec)


# -- the check -----------------------------------------------------------------------------------
def test_gelu_needs_2_8_and_the_refusal_is_the_runtimes_own_words() -> None:
    model = flatbuffer.from_bytes(gelu_bytes())
    old = runtimes.check(model, "tflite-runtime==2.7.0")
    assert not old.runtime_ok
    gelu = next(f for f in old.findings if f.need.op == "GELU")
    assert gelu.reason.startswith(
        "Op builtin_code out of range: 150. Are you using old TFLite binary with newer model?"
    )
    assert [f.need.op for f in old.refused] == ["GELU"]
    assert runtimes.check(model, "tflite-runtime==2.8.0").runtime_ok
    assert runtimes.oldest(model) == {
        "tflite-runtime": "tflite-runtime==2.8.0",
        "tensorflow": "tensorflow==2.8.0",
        "ai-edge-litert": "ai-edge-litert==1.4.0",
    }


def test_a_version_the_release_lacks_is_didnt_find_op() -> None:
    model = flatbuffer.from_bytes(gelu_bytes(version=2))  # int8 GELU: TFLite 2.9
    finding = runtimes.check(model, "tflite-runtime==2.8.0").refused[0]
    assert finding.highest == 1
    assert finding.reason == (
        "Didn't find op for builtin opcode 'GELU' version '2'. An older version of this builtin"
        " might be supported. Are you using an old TFLite binary with a newer model?"
        " (tflite-runtime 2.8.0 has GELU up to version 1; first in TensorFlow Lite 2.9.0)"
    )


def test_custom_ops_the_resolver_carries_and_the_edge_tpu_op() -> None:
    g = G()
    x = g.input((1, 4))
    y = g.op("CUSTOM", [x], (1, 4))
    g.graph.ops[-1].custom_code = "edgetpu-custom-op"
    model = flatbuffer.from_bytes(g.bytes(y))
    plain = runtimes.check(model, "tflite-runtime==2.11.0")
    assert not plain.runtime_ok and plain.refused[0].delegate == "edgetpu"
    assert "Encountered unresolved custom op: edgetpu-custom-op." in plain.refusal()
    assert runtimes.check(model, "tflite-runtime==2.11.0", delegate="edgetpu").runtime_ok
    model.main.ops[0].custom_code = "TFLite_Detection_PostProcess"
    assert runtimes.check(model, "tflite-runtime==2.5.0").runtime_ok


# -- the CLI -------------------------------------------------------------------------------------
def test_check_runtime_json_and_exit_status(tmp_path: Path, capsys) -> None:
    path = tmp_path / "gelu.tflite"
    path.write_bytes(gelu_bytes())
    assert main(["check", str(path), "--runtime", "tflite-runtime==2.7.0", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["runtime_ok"] is False and report["runtime"] == "tflite-runtime==2.7.0"
    assert [(o["op"], o["version"], o["ok"]) for o in report["ops"]] == [
        ("FULLY_CONNECTED", 1, True),
        ("GELU", 1, False),
    ]
    assert report["oldest_runtime"]["tflite-runtime"] == "tflite-runtime==2.8.0"
    assert main(["check", str(path), "--runtime", "tflite-runtime==2.8.0"]) == 0
    out = capsys.readouterr().out
    assert "runtime_ok: tflite-runtime 2.8.0 resolves every op of this model" in out
    assert main(["check", str(path)]) == 0  # without --runtime: the oldest release
    assert "oldest runtime that runs it: tflite-runtime 2.8.0" in capsys.readouterr().out


def test_check_target_and_runtime_together(tmp_path: Path, capsys) -> None:
    path = tmp_path / "gelu.tflite"
    path.write_bytes(gelu_bytes())
    code = main(["check", str(path), "--target", "xnnpack", "--runtime", "ai-edge-litert==2.3.0",
                 "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["runtime_ok"] is True
    assert report["runtime"]["runtime"] == "ai-edge-litert==2.3.0" and "ops" in report


def test_check_refuses_a_bad_runtime_in_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "gelu.tflite"
    path.write_bytes(gelu_bytes())
    assert main(["check", str(path), "--runtime", "tflite-runtime==9.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tflfuse: error: runtime 'tflite-runtime==9.9': no data")
    assert err.count("\n") == 1


def test_check_runtime_needs_no_tensorflow(tmp_path: Path) -> None:
    path = tmp_path / "gelu.tflite"
    path.write_bytes(gelu_bytes())
    code = (
        "import sys\n"
        "for name in ('tensorflow', 'keras', 'tf_keras'): sys.modules[name] = None\n"
        "from tflfuse.cli import main\n"
        f"rc = main(['check', {str(path)!r}, '--runtime', 'tflite-runtime==2.5.0'])\n"
        "assert 'tensorflow' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "sys.exit(rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "NO  GELU v1 (builtin 150)" in proc.stdout


@pytest.mark.skipif(not PYTORCH.is_dir(), reason="../shared/models/pytorch is absent")
def test_the_pytorch_encoder_export_needs_gelu() -> None:
    model = flatbuffer.load(PYTORCH / "encoder.tflite")
    found = runtimes.oldest(model)
    assert found["tflite-runtime"] == "tflite-runtime==2.8.0"
    cnn = flatbuffer.load(PYTORCH / "mobilenet_v2.tflite")
    assert runtimes.oldest(cnn)["tflite-runtime"] == "tflite-runtime==2.5.0"


def test_verdicts_cover_every_runtime() -> None:
    verdicts = runtimes.verdicts(flatbuffer.from_bytes(gelu_bytes()))
    assert set(verdicts) == set(runtimes.known_runtimes())
    assert verdicts["tflite-runtime==2.8.0"] is None
    assert verdicts["tflite-runtime==2.7.0"].startswith("GELU v1 (builtin 150) cannot run on")
    assert np.all([v is None for k, v in verdicts.items() if k.startswith("ai-edge-litert")])


def test_an_int8_op_labelled_v1_needs_the_version_its_type_does() -> None:
    """litert-quantizer writes version 1 for an int8 GELU; op_version.cc gives it v2 (2.9).
    tflite-runtime 2.8 resolves v1 and fails when the op runs (benchmarks/RUNTIMES.md)."""
    from test_rules_edgetpu import Q8

    g = Q8()
    x = g.input((1, 16))
    model = flatbuffer.from_bytes(g.bytes(g.op("GELU", [x], x.shape, 0.03, -20)))
    assert model.main.ops[0].version == 2  # what tflfuse writes (tests/test_op_versions.py)
    model.main.ops[0].version = 1  # as litert-quantizer's file says
    [need] = runtimes.needs(model)
    assert (need.version, need.declared) == (2, 1)
    refused = runtimes.check(model, "tflite-runtime==2.8.0").refused[0]
    assert refused.reason.startswith("tflite-runtime 2.8.0 resolves GELU v1, the version the file")
    assert runtimes.check(model, "tflite-runtime==2.9.1").runtime_ok
    assert runtimes.check(model, "tflite-runtime==2.8.0").to_dict()["ops"][0]["version_field"] == 1


# -- convert --runtime and the recipe key ----------------------------------------------------------
def test_convert_runtime_writes_a_model_the_release_runs_and_says_so(tmp_path: Path) -> None:
    from tflfuse.convert.pipeline import convert

    source = tmp_path / "gelu.tflite"
    source.write_bytes(gelu_bytes())
    result = convert(source, recipe="cpu-float", output_dir=tmp_path / "out", progress=False,
                     runtime="tflite-runtime==2.7.0")  # fmt: skip
    made = result.report["runtime"]
    assert made["made_for"] == "tflite-runtime==2.7.0" and made["fired"] == {"SpellOutGelu": 1}
    assert made["fused"]["runtime_ok"] is True
    assert made["stock"]["runtime_ok"] is False  # the model as given still holds GELU
    assert runtimes.check(flatbuffer.load(result.fused), "tflite-runtime==2.7.0").runtime_ok
    assert "Made for **tflite-runtime==2.7.0**" in (tmp_path / "out" / "report.md").read_text()


def test_the_recipe_key_runtime_is_checked_and_named(tmp_path: Path) -> None:
    from tflfuse.convert import recipe

    rec = recipe.from_dict({"name": "coral", "target": "edgetpu", "runtime": "tflite-runtime==2.5"})
    assert rec.runtime == "tflite-runtime==2.5"
    with pytest.raises(recipe.RecipeError, match=r"^my\.toml: runtime 'tflite-runtime==9\.9': no"):
        recipe.from_dict({"name": "x", "runtime": "tflite-runtime==9.9"}, source="my.toml")
    with pytest.raises(recipe.RecipeError, match=r"^--runtime 'litert==0\.1': no data"):
        recipe.load("cpu-float").override(labels={"runtime": "--runtime"}, runtime="litert==0.1")
