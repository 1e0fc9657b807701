#!/usr/bin/env python3
"""Regenerate `delegates/runtimes.toml` from TensorFlow Lite's own sources (LiteRT's git history).

    python benchmarks/runtimes_data.py LITERT_GIT_DIR [-o delegates/runtimes.toml]

LITERT_GIT_DIR is a clone (or bare mirror) of google-ai-edge/LiteRT with its tags. The facts are
read from three files, at the commits the output names:
- `tflite/converter/tools/versioning/runtime_version.cc` at the newest commit: for every builtin
  op version, the first TensorFlow Lite release that runs it (`FindMinimumRuntimeVersionForOp`).
  This is the basis of every TensorFlow / tflite-runtime release (2.5 ... 2.21): their own
  `register.cc` files are not reachable here (TensorFlow's repository is too large to fetch).
- `tflite/core/kernels/register.cc` at each ai-edge-litert release tag: the versions each builtin
  op registers (`AddBuiltin(op, reg, min_version, max_version)`) and the custom ops the builtin
  resolver carries (`AddCustom`). This is the basis of every ai-edge-litert release from 1.4.0.
- `tflite/converter/schema/schema.fbs` (newest commit and each tag): builtin op codes.
Only facts go into the table (numbers and names), never code. The real interpreters check it
(`tests/test_runtimes_probe.py`, `benchmarks/runtime_matrix.py`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

RUNTIME_VERSION = "tflite/converter/tools/versioning/runtime_version.cc"
REGISTER = "tflite/core/kernels/register.cc"
SCHEMAS = ("tflite/converter/schema/schema.fbs", "tflite/stablehlo/schema/schema.fbs")

# TensorFlow Lite releases whose data is runtime_version.cc's (tflite-runtime on PyPI: 2.7-2.14;
# 2.5.0 and 2.6.0 only as Coral's and distributions' builds; TensorFlow's tf.lite: all)
TFLITE_RUNTIME = ("2.5.0", "2.6.0", "2.7.0", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0",
                  "2.13.0", "2.14.0")  # fmt: skip
TENSORFLOW = tuple(f"2.{m}.0" for m in range(5, 22))
# ai-edge-litert release tags with tflite/ in LiteRT (1.0.1-1.3.0 were built from TensorFlow's
# master branch at build time, pinned nowhere)
LITERT_TAGS = ("v1.4.0", "v1.4.1", "v2.0.2", "v2.0.3", "v2.1.0", "v2.1.1", "v2.1.2", "v2.1.3",
               "v2.1.4", "v2.1.5", "v2.1.6", "v2.2.0", "HEAD")  # fmt: skip
# LiteRT has no v2.3.0 tag in the snapshot read here: ai-edge-litert 2.3.0 (the pinned runtime)
# takes the newest commit, which tests/test_runtimes_probe.py checks against the installed 2.3.0
RELEASE_OF_TAG = {"HEAD": "2.3.0"}
# Where runtime_version.cc is wrong about a release, measured on the real interpreters here
# (PyPI's tflite-runtime wheels 2.7.0-2.14.0 and TensorFlow 2.21.0, opcode by opcode: see
# tests/test_runtimes_probe.py). (op, version) -> (the first release that resolves it, evidence).
# "" = no TensorFlow release known here resolves it. Releases not measured (2.5, 2.6, 2.15-2.20)
# keep runtime_version.cc's word.
CORRECTIONS = {
    ("CONV_2D", 7): ("2.12.0", "tflite-runtime 2.11.0 refuses it; 2.12.0 resolves it"),
    ("DEPTHWISE_CONV_2D", 7): (
        "2.13.0",
        "tflite-runtime 2.11.0, 2.12.0 refuse it; 2.13.0 has it",
    ),
    ("FULLY_CONNECTED", 10): (
        "2.13.0",
        "tflite-runtime 2.11.0, 2.12.0 refuse it; 2.13.0 has it",
    ),
    ("BATCH_TO_SPACE_ND", 4): ("2.13.0", "tflite-runtime 2.12.0 refuses it; 2.13.0 resolves it"),
    ("SPACE_TO_BATCH_ND", 4): ("2.13.0", "tflite-runtime 2.12.0 refuses it; 2.13.0 resolves it"),
    ("EXP", 2): ("2.13.0", "tflite-runtime 2.12.0 refuses it; 2.13.0 resolves it"),
    ("CAST", 5): ("2.13.0", "tflite-runtime 2.12.0 refuses it; 2.13.0 resolves it"),
    ("MIRROR_PAD", 3): ("2.13.0", "tflite-runtime 2.12.0 refuses it; 2.13.0 resolves it"),
    ("SELECT", 4): ("2.14.0", "tflite-runtime 2.12.0 and 2.13.0 refuse it; 2.14.0 resolves it"),
    ("SELECT_V2", 2): ("2.14.0", "tflite-runtime 2.12.0 and 2.13.0 refuse it; 2.14.0 resolves it"),
    ("PACK", 4): ("2.14.0", "tflite-runtime 2.13.0 refuses it; 2.14.0 resolves it"),
    ("TRANSPOSE_CONV", 4): ("2.12.0", "tflite-runtime 2.11.0 refuses it; 2.12.0 resolves it"),
    ("GELU", 1): (
        "2.8.0",
        "tflite-runtime 2.7.0: out of range; 2.8.0 resolves it",
    ),
    ("RANDOM_STANDARD_NORMAL", 1): (
        "2.7.0",
        "tflite-runtime 2.7.0 has it (older: not measured)",
    ),
    ("QUANTIZE", 5): ("", "tensorflow 2.21.0 refuses it (ai-edge-litert registers it from 2.1.3)"),
    ("QUANTIZE", 6): ("", "tensorflow 2.21.0 refuses it (ai-edge-litert registers it from 2.1.3)"),
    ("STABLEHLO_CBRT", 1): ("", "tensorflow 2.21.0 refuses it; no register.cc here registers it"),
}
# The version an op needs by its operands, whatever its `version` field says: litert-quantizer
# writes version 1 for every op, and an int8 GELU labelled v1 passes the opcode lookup of a
# release whose GELU kernel is float-only, then fails when tensors are allocated (measured:
# tflite-runtime 2.8.0). tflfuse writes every op at least at this version (tflfuse.ir.op_versions)
# and `check` reads a file's ops through it. Transcribed from GetBuiltinOperatorVersion in
# op_version.cc: per op, its tests in the source's order, the first that holds gives the version
# (none: 1). A test is words that must all hold: inK=T|T (input K's type), outK=T, quantizedK
# (input K has a scale), per_channelK (input K has per-channel scales), per_channel_out0,
# inputs=N (operands listed), hasK (input K is given), activation (a fused activation),
# opt:NAME (option NAME is true), dilated, grouped (a conv whose input has more channels than
# its filter), rank0>N (input 0's rank), broadcast>4 (inputs of different shapes, one of rank
# over 4), rescale>=1 (a quantized MUL whose input scales' product is at least the output's);
# a leading ! negates one. The ops tflfuse writes or edits (tests/test_op_versions.py collects
# them from the rules and legalizations) and the common ones beside them; an op absent here is 1.
OP_VERSION = "tflite/converter/tools/versioning/op_version.cc"
_INT8_2 = [(2, "in0=INT8")]
OP_VERSIONS: dict[str, list[tuple[int, str]]] = {
    "CONV_2D": [
        (6, "grouped"),
        (3, "in0=INT8 in1=INT8 out0=INT8"),
        (7, "in0=INT8 in1=INT4 out0=INT8"),
        (5, "in0=FLOAT32 in1=INT8 out0=FLOAT32 per_channel1"),
        (2, "in0=FLOAT32 in1=INT8 out0=FLOAT32"),
    ],
    "DEPTHWISE_CONV_2D": [
        (6, "in0=FLOAT32 in1=INT8 out0=FLOAT32 per_channel1"),
        (4, "in0=FLOAT32 in1=INT8 out0=FLOAT32"),
        (3, "in0=INT8 in1=INT8 out0=INT8"),
        (7, "in0=INT8 in1=INT4 out0=INT8"),
        (2, "dilated"),
    ],
    "FULLY_CONNECTED": [
        (13, "in0=INT16 in1=INT4 out0=INT16"),
        (12, "in0=FLOAT32 in1=INT8 out0=FLOAT32 per_channel1"),
        (7, "in0=INT16 in1=INT16 out0=INT16"),
        (6, "inputs=2"),
        (5, "opt:keep_num_dims"),
        (4, "in0=INT8 in1=INT8 out0=INT8"),
        (10, "in0=INT8 in1=INT4 out0=INT8"),
        (9, "in0=FLOAT32 in1=INT8 out0=FLOAT32 opt:asymmetric_quantize_inputs"),
        (3, "in0=FLOAT32 in1=INT8 out0=FLOAT32"),
    ],
    "TRANSPOSE_CONV": [(4, "activation"), (3, "has3"), (2, "in1=INT8")],
    "ADD": [(6, "in0=FLOAT16"), (5, "in0=INT16 !quantized0"), (4, "in0=INT64"), (2, "in0=INT8")],
    "SUB": [(4, "in0=INT64"), (3, "broadcast>4"), (2, "in0=INT8")],
    "MUL": [
        (8, "in0=FLOAT16"),
        (7, "in0=INT16 !quantized0"),
        (7, "in0=UINT32"),
        (6, "in0=COMPLEX64"),
        (5, "in0=INT64"),
        (4, "in0=INT16"),
        (3, "rescale>=1"),
        (2, "in0=INT8"),
    ],
    "DIV": [(2, "broadcast>4")],
    "MAXIMUM": [(4, "in0=INT16 out0=INT16"), (3, "broadcast>4"), (2, "in0=INT8")],
    "MINIMUM": [(4, "in0=INT16 out0=INT16"), (3, "broadcast>4"), (2, "in0=INT8")],
    "AVERAGE_POOL_2D": [(3, "in0=INT16 out0=INT16"), (2, "in0=INT8")],
    "MAX_POOL_2D": [(3, "in0=INT16 out0=INT16"), (2, "in0=INT8")],
    "CONCATENATION": [
        (6, "in0=FLOAT16"),
        (5, "in0=INT4"),
        (4, "in0=UINT32"),
        (3, "in0=INT16"),
        (2, "in0=INT8"),
    ],
    "TRANSPOSE": [
        (9, "in0=FLOAT16"),
        (8, "rank0>6"),
        (8, "in0=BFLOAT16"),
        (7, "in0=INT4"),
        (6, "rank0>5"),
        (5, "in0=INT16"),
        (4, "rank0>4"),
        (3, "in0=BOOL"),
        (2, "in0=INT8"),
    ],
    "SLICE": [
        (8, "in0=FLOAT16"),
        (7, "in0=INT4"),
        (6, "in0=UINT32"),
        (5, "rank0>4"),
        (4, "in0=INT16"),
        (3, "in0=STRING"),
        (2, "in0=INT8"),
    ],
    "STRIDED_SLICE": [
        (8, "opt:offset"),
        (7, "in0=UINT32"),
        (6, "opt:ellipsis_mask"),
        (6, "opt:new_axis_mask"),
        (5, "in0=STRING"),
        (4, "rank0>4"),
        (3, "in0=BOOL"),
        (2, "in0=INT8"),
    ],
    "SPLIT": [(4, "in1=INT16"), (3, "in1=INT32"), (2, "in1=INT8")],
    "SPLIT_V": _INT8_2,
    "PAD": [(5, "in0=BOOL"), (4, "rank0>4"), (3, "in0=INT16"), (2, "in0=INT8")],
    "PADV2": [(5, "in0=BOOL"), (4, "rank0>4"), (3, "in0=INT16"), (2, "in0=INT8")],
    "PACK": [(2, "in0=INT8"), (3, "in0=INT16 out0=INT16"), (4, "in0=UINT32")],
    "UNPACK": [
        (2, "in0=INT8|UINT8"),
        (3, "in0=BOOL"),
        (4, "in0=INT16 out0=INT16"),
        (5, "in0=FLOAT16|BFLOAT16"),
    ],
    "TILE": [(3, "in0=INT8"), (2, "in0=STRING")],
    "SQUEEZE": [(2, "in0=STRING")],
    "GATHER": [
        (7, "in0=INT4"),
        (6, "in1=INT16"),
        (5, "opt:batch_dims"),
        (4, "in0=INT16"),
        (3, "in0=BOOL"),
        (2, "in0=INT8"),
    ],
    "BROADCAST_TO": [(3, "in0=INT8|INT16"), (2, "")],
    "SPACE_TO_BATCH_ND": [(4, "in0=INT16"), (3, "!rank0=4"), (2, "in0=INT8")],
    "BATCH_TO_SPACE_ND": [(4, "in0=INT16"), (3, "!rank0=4"), (2, "in0=INT8")],
    "MEAN": [(3, "in0=INT16"), (2, "in0=INT8")],
    "REDUCE_MAX": [(3, "in0=INT16"), (2, "in0=INT8")],
    "REDUCE_MIN": [(3, "in0=INT16"), (2, "in0=INT8")],
    "SUM": _INT8_2,
    "RELU": [(3, "in0=INT16"), (2, "in0=INT8|UINT8")],
    "RELU6": [(3, "in0=INT16"), (2, "in0=INT8")],
    "LEAKY_RELU": [(2, "in0=INT16")],
    "TANH": [(3, "in0=INT16 out0=INT16"), (2, "in0=INT8")],
    "LOGISTIC": [(3, "in0=INT16 out0=INT16"), (2, "in0=INT8")],
    "GELU": [(2, "in0=INT8|UINT8")],
    "SOFTMAX": [(4, "in0=FLOAT16"), (3, "in0=INT16"), (2, "in0=INT8")],
    "LOG_SOFTMAX": _INT8_2,
    "EXP": [(2, "in0=INT8|INT16")],
    "LOG": [(2, "in0=INT8|INT16")],
    "SQRT": [(2, "in0=INT8|INT16")],
    "RSQRT": [(3, "in0=INT16"), (2, "in0=INT8")],
    "ABS": [(5, "in0=INT32"), (3, "in0=INT16 quantized0"), (4, "in0=INT16"), (2, "in0=INT8|UINT8")],
    "SQUARED_DIFFERENCE": _INT8_2,
    "DEPTH_TO_SPACE": _INT8_2,
    "SPACE_TO_DEPTH": _INT8_2,
    "L2_NORMALIZATION": [(2, "out0=INT8")],
    "ARG_MAX": [(3, "in0=BOOL"), (2, "in0=INT8")],
    "ARG_MIN": [(3, "in0=BOOL"), (2, "in0=INT8")],
    "QUANTIZE": [
        (5, "in0=UINT4"),
        (5, "out0=UINT4"),
        (4, "in0=INT4"),
        (4, "out0=INT4"),
        (3, "per_channel_out0"),
        (2, "out0=INT16"),
    ],
    "DEQUANTIZE": [
        (8, "in0=UINT4"),
        (7, "in0=INT2"),
        (6, "in0=INT4"),
        (3, "in0=INT16"),  # and FLOAT16 at HEAD; converter-made fp16 files say 2 (below)
        (5, "in0=INT8 per_channel0"),
        (2, "in0=INT8"),
    ],
    "RESIZE_BILINEAR": [(4, "in0=INT16"), (3, "opt:half_pixel_centers"), (2, "in0=INT8")],
    "RESIZE_NEAREST_NEIGHBOR": [
        (4, "in0=INT16"),
        (3, "opt:half_pixel_centers"),
        (3, "opt:align_corners"),
        (2, "in0=INT8"),
    ],
    "BATCH_MATMUL": [
        (3, "in0=INT16"),
        (2, "in0=INT8"),
        (4, "in0=FLOAT32 in1=INT8 out0=FLOAT32 opt:asymmetric_quantize_inputs"),
    ],
    "SELECT": [(4, "in0=UINT32"), (2, "in0=INT8")],
}
# Kept as the files say where op_version.cc changed its mind: a float16 DEQUANTIZE is 3 at HEAD,
# but the converter wrote 2 into the float16 models users have (MediaPipe's face detection,
# tests/test_flatbuffer_roundtrip.py), and every release in the table has both.
# Ops op_version.cc leaves at 1 for every operand type (its default), listed so a test can
# tell an op known to be 1 from one nobody looked at.
ALWAYS_1 = ("RESHAPE", "EXPAND_DIMS", "RELU_N1_TO_1", "RELU_0_TO_1", "HARD_SWISH", "PRELU",
            "SHAPE", "CAST_SAME_TYPE", "NEG", "FLOOR", "SQUARE", "POW")  # fmt: skip
# The custom ops BuiltinOpResolver carries (AddCustom in register.cc of every LiteRT tag here;
# tests/test_runtimes_probe.py finds them in tflite-runtime 2.7-2.14 too)
CUSTOM_OPS = ("AudioSpectrogram", "Mfcc", "NumericVerify", "TFLite_Detection_PostProcess")
NOTES = {
    "tflite-runtime==2.5.0": "not on PyPI: the build Coral's pycoral 2.0 pins (Mendel, Python 3.7)."
    " Its data is runtime_version.cc's 2.5.0 entries; no interpreter here checks it",
    "tflite-runtime==2.6.0": "not on PyPI for the Pythons here; runtime_version.cc's 2.6.0 entries",
}

_MAP_ENTRY = re.compile(r"\{\{\s*BuiltinOperator_(\w+)\s*,\s*(\d+)\s*\}\s*,\s*\"([^\"]*)\"\s*\}")
_NUMBER = r"(?:/\*[^*]*\*/\s*)?(\d+)"
_ADD_BUILTIN = re.compile(
    r"AddBuiltin\(\s*BuiltinOperator_(\w+)\s*,\s*[\w:]+\(\)\s*"
    rf"(?:,\s*{_NUMBER}\s*,\s*{_NUMBER}\s*)?\)"
)
_ADD_CUSTOM = re.compile(r"AddCustom\(\s*\"([^\"]+)\"")
_ENUM = re.compile(r"enum\s+BuiltinOperator\s*:\s*int32\s*\{(.*?)\}", re.S)
_ENUM_ENTRY = re.compile(r"^\s*(\w+)\s*=\s*(\d+)\s*,?", re.M)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def show(repo: Path, commit: str, path: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else None


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def builtin_codes(repo: Path, commit: str) -> dict[str, int] | None:
    """op name -> code from the schema at `commit` (None: no tflite schema.fbs there; LiteRT
    before 2.0 took it from TensorFlow)."""
    for path in SCHEMAS:
        text = show(repo, commit, path)
        match = _ENUM.search(text or "")
        if match:
            body = re.sub(r"//[^\n]*", "", match.group(1))
            return {name: int(code) for name, code in _ENUM_ENTRY.findall(body)}
    return None


def min_runtimes(text: str) -> dict[str, dict[int, str]]:
    """op -> {version: first release} from runtime_version.cc (entries with "" are skipped)."""
    out: dict[str, dict[int, str]] = {}
    for op, version, release in _MAP_ENTRY.findall(re.sub(r"//[^\n]*", "", text)):
        if release:
            out.setdefault(op, {})[int(version)] = release
    return out


def registrations(text: str) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """(op -> (min, max) version, custom op names) of BuiltinOpResolver in register.cc."""
    start = text.index("BuiltinOpResolver::BuiltinOpResolver()")
    body = re.sub(r"//[^\n]*", "", text[start:])
    body = body[: body.index("may_directly_contain_user_defined_ops_")]
    ops = {}
    for op, low, high in _ADD_BUILTIN.findall(body):
        ops[op] = (int(low or 1), int(high or 1))
    return ops, sorted(set(_ADD_CUSTOM.findall(body)))


def toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def generate(repo: Path) -> str:
    head = git(repo, "rev-parse", "HEAD").strip()
    head_date = git(repo, "log", "-1", "--format=%ad", "--date=short", "HEAD").strip()
    codes = builtin_codes(repo, head)
    if codes is None:
        raise SystemExit(f"no schema.fbs with a BuiltinOperator enum at {head}")
    since = min_runtimes(show(repo, head, RUNTIME_VERSION) or "")
    unknown = sorted(set(since) - set(codes))
    if unknown:
        raise SystemExit(f"runtime_version.cc names ops the schema does not: {unknown}")
    lines = [
        "# Which TensorFlow Lite interpreter runs which builtin op versions: the data behind",
        "# `tflfuse check --runtime`, `convert/optimize --runtime` and a bundle's device check.",
        "# Generated by benchmarks/runtimes_data.py from LiteRT's sources (facts only, no code):",
        "# edit that script, not this file. Every runtime names its basis and every basis its",
        "# file and commit. Checked against real interpreters by tests/test_runtimes_probe.py.",
        "",
        "format = 1",
        "",
        "[sources.runtime_version]",
        'repo = "google-ai-edge/LiteRT"',
        f'commit = "{head}"  # {head_date}',
        f'file = "{RUNTIME_VERSION}"',
        'what = "FindMinimumRuntimeVersionForOp: op version -> first TensorFlow Lite release"',
        "",
        "[sources.schema]",
        'repo = "google-ai-edge/LiteRT"',
        f'commit = "{head}"',
        f'file = "{SCHEMAS[0]}"',
        'what = "enum BuiltinOperator: op name -> builtin code"',
        "",
    ]
    lines += [
        "[sources.op_version]",
        'repo = "google-ai-edge/LiteRT"',
        f'commit = "{head}"',
        f'file = "{OP_VERSION}"',
        'what = "GetBuiltinOperatorVersion: the version an op needs by its tensor types"',
        "",
    ]
    tables = {}
    for tag in LITERT_TAGS:
        commit = git(repo, "rev-list", "-n", "1", tag).strip()
        release = RELEASE_OF_TAG.get(tag, tag[1:])
        text = show(repo, commit, REGISTER)
        if text is None:
            continue
        ops, custom = registrations(text)
        tag_codes = builtin_codes(repo, commit)
        if tag_codes is None:  # the highest code of an op it registers
            max_code, how = max(codes[op] for op in ops), "highest code it registers (derived)"
        else:
            max_code, how = max(tag_codes.values()), "enum BuiltinOperator at this tag"
        tables[tag] = (commit, ops, custom, max_code, release)
        lines += [
            f'[sources."register@{tag}"]',
            'repo = "google-ai-edge/LiteRT"',
            f'commit = "{commit}"',
            f'file = "{REGISTER}"',
            f'what = "BuiltinOpResolver of ai-edge-litert {release}: AddBuiltin min/max versions'
            ', AddCustom"',
            f"max_builtin_code = {max_code}  # {how}",
            "",
        ]
    lines += [
        "# Runtimes. basis = runtime_version: the release runs every op version whose first",
        "# release (ops below) is not newer than `tflite`; basis = register: what that release's",
        "# register.cc registers ([registered.NAME]).",
    ]
    effective = {op: dict(v) for op, v in since.items()}
    for (op, version), (first, _) in CORRECTIONS.items():
        effective.setdefault(op, {})[version] = first
    for version in TFLITE_RUNTIME:
        lines += _runtime_entry(f"tflite-runtime=={version}", version, effective, codes)
    for version in TENSORFLOW:
        lines += _runtime_entry(f"tensorflow=={version}", version, effective, codes)
    shared: dict[str, str] = {}  # tag -> the first tag with the same registrations
    for tag, (_, ops, custom, max_code, release) in tables.items():
        same = next((t for t in shared.values() if tables[t][1] == ops), tag)
        shared[tag] = same
        lines += [
            f'[runtimes."ai-edge-litert=={release}"]',
            'basis = "register"',
            f'source = "register@{tag}"',
            f'registered = "{same}"  # [registered."{same}"]',
            f"max_builtin_code = {max_code}",
            f"custom_ops = [{', '.join(toml_string(c) for c in custom)}]",
            "",
        ]
    lines += [
        "# Measured corrections to runtime_version.cc (first release that resolves op.version;",
        '# "" = none known), each with its evidence. tflfuse applies them over [ops].',
        "[corrections]",
    ]
    for (op, version), (first, evidence) in CORRECTIONS.items():
        rv = since.get(op, {}).get(version, "")
        lines.append(
            f'"{op}.{version}" = {{ since = "{first}", runtime_version = "{rv}",'
            f" evidence = {toml_string(evidence)} }}"
        )
    lines += version_lines()
    lines += ["", "# Builtin ops: code, and the first release of each version (1 first).", ""]
    lines.append("[ops]")
    for op in sorted(since, key=lambda o: codes[o]):
        versions = since[op]
        top = max(versions)
        firsts = [versions.get(v, "") for v in range(1, top + 1)]
        text = ", ".join(toml_string(f) for f in firsts)
        lines.append(f"{op} = {{ code = {codes[op]}, since = [{text}] }}")
    lines.append("")
    for tag, (_, ops, _, _, _) in tables.items():
        if shared[tag] != tag:
            continue
        lines.append(f'[registered."{tag}"]  # op = [min_version, max_version] at register@{tag}')
        for op in sorted(ops, key=lambda o: codes.get(o, 10**6)):
            low, high = ops[op]
            lines.append(f"{op} = [{low}, {high}]")
        lines.append("")
    return "\n".join(lines)


def version_lines() -> list[str]:
    """The [versions] table: per op, [version, test] pairs in op_version.cc's order."""
    lines = [
        "",
        "# The version an op needs by its operands, over its `version` field (litert-quantizer",
        "# writes 1): per op, [version, test] in sources.op_version's order, the first test that",
        "# holds gives it (none: 1). Words of a test: benchmarks/runtimes_data.py, OP_VERSIONS.",
        "[versions]",
    ]
    for op, tests in OP_VERSIONS.items():
        cells = ", ".join(f'[{v}, "{t}"]' for v, t in tests)
        lines.append(f"{op} = [{cells}]")
    lines.append("always_1 = [" + ", ".join(f'"{op}"' for op in ALWAYS_1) + "]")
    return lines


def _runtime_entry(name: str, version: str, since: dict, codes: dict[str, int]) -> list[str]:
    """A runtime_version-based runtime: its highest builtin code is the highest code of an op
    whose version 1 it runs (the schema of that release is not reachable here)."""
    key = version_key(version)
    known = [codes[op] for op, v in since.items() if v.get(1) and version_key(v[1]) <= key]
    entry = [
        f'[runtimes."{name}"]',
        'basis = "runtime_version"',
        'source = "runtime_version"',
        f'tflite = "{version}"',
        f"max_builtin_code = {max(known)}  # the highest code of an op it runs (derived)",
        f"custom_ops = [{', '.join(toml_string(c) for c in CUSTOM_OPS)}]",
    ]
    if name in NOTES:
        entry.append(f"note = {toml_string(NOTES[name])}")
    return [*entry, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("litert", type=Path, help="LiteRT git directory (with tags)")
    default = Path(__file__).resolve().parents[1] / "delegates" / "runtimes.toml"
    p.add_argument("-o", "--output", type=Path, default=default)
    args = p.parse_args(argv)
    text = generate(args.litert)
    args.output.write_text(text)
    print(f"{args.output}: {text.count(chr(10))} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
