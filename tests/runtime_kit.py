"""Real TFLite interpreters for the runtime tests and the matrix (benchmarks/runtime_matrix.py).

Interpreters other than the one tflfuse runs with live in venvs made by
`benchmarks/install_runtimes.py DEST` (tflite-runtime 2.7-2.14 on pyenv's Python 3.7/3.8,
older ai-edge-litert releases); the environment variable TFLFUSE_RUNTIMES names DEST. Each venv
has a `runtime.json` ({"package", "version", "python"}). The interpreters of this environment
(ai-edge-litert, and TensorFlow's tf.lite when TensorFlow is installed) are always there.
A model is tried by `device_scripts/try_models.py` in a child process of that venv's Python:
load, allocate, invoke, as on a device.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRY_MODELS = REPO / "device_scripts" / "try_models.py"
ENV = "TFLFUSE_RUNTIMES"
# ../shared (PyTorch exports, the Coral oracle); TFLFUSE_SHARED names it for a worktree elsewhere
SHARED = Path(os.environ.get("TFLFUSE_SHARED", REPO.parent / "shared"))


@dataclass(frozen=True)
class Interpreter:
    name: str  # "tflite-runtime==2.7.0", the table's name for it
    python: str
    package: str  # the import name try_models.py is told to use

    @property
    def family(self) -> str:
        return self.name.partition("==")[0]


def _here(package: str, dist: str, family: str) -> Interpreter | None:
    if importlib.util.find_spec(package) is None:
        return None
    try:
        v = version(dist)
    except PackageNotFoundError:
        return None
    release = ".".join(v.split(".")[:3])
    return Interpreter(f"{family}=={release}", sys.executable, package)


def installed() -> list[Interpreter]:
    """Every interpreter reachable here: this environment's, then TFLFUSE_RUNTIMES' venvs."""
    found = [
        i
        for i in (
            _here("ai_edge_litert", "ai-edge-litert", "ai-edge-litert"),
            _here("tensorflow", "tensorflow", "tensorflow"),
        )
        if i is not None
    ]
    root = os.environ.get(ENV)
    if root and Path(root).is_dir():
        for marker in sorted(Path(root).glob("*/runtime.json")):
            info = json.loads(marker.read_text())
            python = marker.parent / "bin" / "python"
            package = info["package"].replace("-", "_")
            if python.is_file():
                found.append(
                    Interpreter(f"{info['package']}=={info['version']}", str(python), package)
                )
    return found


def try_models(
    interp: Interpreter, paths: list[Path], *, construct_only: bool = False, timeout: float = 300
) -> tuple[dict, list[dict]]:
    """({"package", "version"}, one result per model) from try_models.py in the interpreter's
    Python. A native crash ends the child: the models it had not reached count as crashed."""
    cmd = [interp.python, str(TRY_MODELS), "--package", interp.package, *map(str, paths)]
    if construct_only:
        cmd.append("--construct-only")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    head = lines[0].get("interpreter", {}) if lines else {}
    results = [line for line in lines[1:] if "model" in line]
    done = {r["model"] for r in results}
    for p in map(str, paths):
        if p not in done:
            results.append(
                {"model": p, "ok": False, "stage": "crash", "error": f"exit {proc.returncode}"}
            )
    return head, results


def try_each(interp: Interpreter, paths: list[Path]) -> dict[str, dict]:
    """try_models for one model per child process (a crash on one leaves the others)."""
    out = {}
    for p in paths:
        _, results = try_models(interp, [p])
        out[str(p)] = results[0]
    return out


def opcode_probe(code: int, version: int, custom: str | None = None) -> bytes:
    """A model whose only operator code is (code, version) and whose graph has no operator: the
    interpreter resolves every operator code when it builds, so building it asks exactly
    whether this release registers that op version."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    opcode = schema.OperatorCodeT()
    opcode.builtinCode = code
    opcode.deprecatedBuiltinCode = min(
        code, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES
    )
    opcode.version = version
    opcode.customCode = custom.encode() if custom else None
    tensor = schema.TensorT()
    tensor.name = b"x"
    tensor.shape = [1]
    tensor.type = schema.TensorType.FLOAT32
    tensor.buffer = 0
    graph = schema.SubGraphT()
    graph.tensors = [tensor]
    graph.inputs = [0]
    graph.outputs = [0]
    graph.operators = []
    graph.name = b"main"
    model = schema.ModelT()
    model.version = 3
    model.operatorCodes = [opcode]
    model.subgraphs = [graph]
    model.buffers = [schema.BufferT()]
    builder = flatbuffers.Builder(256)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
