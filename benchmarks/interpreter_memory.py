"""How much memory one interpreter of a model takes, per kernel set: where a conversion's peak is.

Issue 25's budget (2 GiB for converting a 640-px YOLO26n) is decided by the largest interpreter a
conversion builds. litert-quantizer calibrates on XNNPACK (its profiler-based mode: one delegate
node per op, `disable_delegate_node_fusion`), while tflfuse's checks run the built-in kernels
(`--delegate none`). This prints, for each model, the resident memory a fresh process gains when
it builds, allocates and invokes once (zeros in) an interpreter of each kind:

  builtin      the built-in kernels, no delegate (what verification and the report run)
  xnnpack      the XNNPACK delegate, nodes fused (a user's default interpreter)
  calibration  XNNPACK one node per op with per-node profiling, as litert-quantizer calibrates

Each kind runs in its own process (a freed interpreter does not always return its pages), so the
numbers do not depend on the order. `--by-type OP[,OP...]` also measures, for each op type, a
model of only that type's ops (their activation inputs made graph inputs): which ops the memory
is for. Measured here (MiB, allocate / invoke) on the fused float model of a 640-px YOLO26n
(`tflfuse optimize --target edgetpu --no-verify` of the corpus' edgetpu-float32 file, 1647 ops)
against its input (657 ops):

    fused     builtin 4 / 148   xnnpack 3305 / 3344   calibration 3295 / 3329
    input     builtin 3 / 35    xnnpack   48 / 64     calibration   38 / 62
    fused, its 222 DEPTHWISE_CONV_2D only:            calibration 3156 / 3567

The attention legalization's sums over the contracted axis are DEPTHWISE_CONV_2D with 32- or
400-tap kernels over 3648-4000 channels (216 ops, 391 MiB of kernels as the ops read them, a few
MiB in the file where the ops share them); XNNPACK packs each op's kernel on its own.

    .venv/bin/python benchmarks/interpreter_memory.py MODEL.tflite [...] [--by-type OP,OP]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("builtin", "xnnpack", "calibration")

_CHILD = r"""
import json, sys
import numpy as np

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")

from litert_quantizer.utils import tfl_interpreter_utils as tu

path, kind = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
options = {
    "builtin": {"use_xnnpack": False},
    "xnnpack": {"use_xnnpack": True},
    "calibration": {
        "use_xnnpack": True,
        "disable_delegate_node_fusion": True,
        "force_delegate_node_profiling": True,
    },
}[kind]
before = rss_mib()
interp = tu.create_tfl_interpreter(data, num_threads=2, preserve_all_tensors=False, **options)
interp.allocate_tensors()
allocated = rss_mib()
for d in interp.get_input_details():
    interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
interp.invoke()
print(json.dumps({"allocated_mib": allocated - before, "invoked_mib": rss_mib() - before}))
"""


def measure(path: str, kind: str) -> dict[str, float]:
    """RSS growth (MiB) of a fresh process building one `kind` interpreter of `path`."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, path, kind],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no message"]
        return {"error": tail[0]}  # type: ignore[dict-item]
    return json.loads(done.stdout.strip().splitlines()[-1])


def only_type(path: str, op_type: str, folder: str) -> tuple[str, int]:
    """A model of `path`'s main-graph ops of `op_type` (the activations they read become graph
    inputs, what they write graph outputs), written into `folder`, and how many ops it holds."""
    from tflfuse.ir import Graph, Model, flatbuffer

    graph = flatbuffer.from_bytes(Path(path).read_bytes()).main
    ops = [o for o in graph.ops if o.type == op_type]
    outs = {id(t): t for o in ops for t in o.outputs if t is not None}
    ins = {
        id(t): t
        for o in ops
        for t in o.inputs
        if t is not None and getattr(t, "data", None) is None and id(t) not in outs
    }
    made = (x for o in ops for x in (*o.inputs, *o.outputs) if x is not None)
    tensors = list({id(t): t for t in [*ins.values(), *made]}.values())
    small = Graph(op_type, ops, tensors, list(ins.values()), list(outs.values()))
    out = os.path.join(folder, f"{os.path.basename(path)}.{op_type}.tflite")
    with open(out, "wb") as f:
        f.write(flatbuffer.to_bytes(Model([small])))
    return out, len(ops)


def _row(name: str, path: str) -> str:
    cells = []
    for kind in KINDS:
        m = measure(path, kind)
        if "error" in m:
            cells.append(f"failed: {str(m['error'])[:60]}")
        else:
            cells.append(f"{m['allocated_mib']:.0f} / {m['invoked_mib']:.0f}")
    return f"| {name} | {' | '.join(cells)} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--by-type", default="", help="OP[,OP...]: also a model of each type's ops")
    args = ap.parse_args()
    print(f"| model | {' | '.join(f'{k} MiB (allocate / invoke)' for k in KINDS)} |")
    print(f"|---|{'---|' * len(KINDS)}")
    for path in args.models:
        print(_row(os.path.basename(path), path), flush=True)
        with tempfile.TemporaryDirectory() as folder:
            for op_type in filter(None, args.by_type.split(",")):
                small, n = only_type(path, op_type, folder)
                print(_row(f"{os.path.basename(path)}: its {n} {op_type}", small), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
