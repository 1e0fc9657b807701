#!/usr/bin/env python3
"""The float tolerance on real models: how close exact rewrites come to the round-off bound
(`tflfuse.verification.roundoff`), and how far above it a real error of 1e-3 relative on one channel
stands.

    .venv/bin/python benchmarks/roundoff_bench.py                 # zoo + ../shared + corpus
    .venv/bin/python benchmarks/roundoff_bench.py --corpus /work/corpus/models --no-zoo

For each float model: the targets' pipelines (exact rewrites only; a pipeline with a declared
approximation is left out), the model defused (rules.defuse) on the plain kernels, on XNNPACK and
on the reference kernels, and the model with its first output's largest channel multiplied by
1 + 1e-3. Each is compared with the input as `optimize` compares: every float output element
against its round-off bound. The table gives the largest |difference| and the largest
|difference| / bound (above 1: refused). Models: the Keras zoo built here (`tflfuse.examples.zoo`,
`weights=None`, calibrated BatchNorm), the litert-torch exports in ../shared/models/pytorch,
and from a corpus folder (`--corpus`, e.g. /work/corpus/models) the MediaPipe landmark models
(float16 weights widened exactly) and the torchvision MobileNetV3 exports (MobileNetV3-Small
also with its logits scaled by 16, the size of a trained model's). Writes
benchmarks/ROUNDOFF.md. Machine-independent: the numbers are numeric differences.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tflfuse.convert.optimize import optimize_bytes  # noqa: E402
from tflfuse.device.interpreter import make_interpreter  # noqa: E402
from tflfuse.errors import TflfuseError  # noqa: E402
from tflfuse.ir import flatbuffer  # noqa: E402
from tflfuse.rewrite import PassManager, TopologicalSort  # noqa: E402
from tflfuse.rules.defuse import Defuse  # noqa: E402
from tflfuse.verification import roundoff, runs, verify  # noqa: E402

PYTORCH = HERE.parent.parent / "shared" / "models" / "pytorch"
ZOO = ("mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "resnet_v2_style")
CORPUS_MODELS = (
    "mobilenet_v3_small.litert",
    "mobilenet_v3_small.onnx2tf",
    "mobilenet_v3_large.litert",
    "mediapipe.hand_landmark_full",
    "mediapipe.pose_landmark_full",
    "mediapipe.palm_detection_full",
    "mediapipe.face_landmark",
)
CASES = ("xnnpack", "edgetpu", "defused none", "defused xnnpack", "defused ref", "off by 1e-3")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def off_by(data: bytes, rel: float = 1e-3) -> bytes | None:
    """`data` with its first output's largest channel (last axis, by mean magnitude over the
    check inputs) multiplied by 1 + rel: a rewrite that got one channel wrong by `rel` (None
    when every channel is zero). tests/test_roundoff.py asserts on this same perturbation."""
    interp = make_interpreter(data, delegate="none")
    ref = runs.run(data, verify.seeded_inputs(interp, 0, 3))
    first = np.stack([np.abs(r[0].astype(np.float64)) for r in ref])
    channels = first.reshape(-1, first.shape[-1]).mean(0)
    j = int(channels.argmax())
    if not channels[j] > 0:
        return None
    model = flatbuffer.from_bytes(data)
    g = model.main
    out = g.outputs[0]
    scale = np.ones(out.shape[-1], np.float32)
    scale[j] = 1.0 + rel
    wrong = g.add_tensor(out.name + "_off", out.shape)
    g.add_op("MUL", [out, g.add_constant("one_channel_off", scale)], [wrong])
    g.outputs[0] = wrong
    model.retarget_signatures({out: wrong})
    return flatbuffer.to_bytes(model)


def measure(reference: bytes, candidate: bytes, delegate: str = "none") -> dict[str, float]:
    a = verify.compare(reference, candidate, delegate=delegate, atol=0.0, rtol=0.0, roundoff=True)
    return {
        "max_abs": a.max_abs,
        "ratio": max((o.get("ratio", 0.0) for o in a.outputs.values()), default=0.0),
        "identical": a.identical,
    }


def cases(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in ("xnnpack", "edgetpu"):
        res = optimize_bytes(data, target=target, verify=False)
        if res.result.approximations():
            out[target] = {"skipped": "declared approximation"}
            continue
        out[target] = {**measure(data, res.data), "fired": sum(res.result.fired().values())}
    model = flatbuffer.from_bytes(data)
    PassManager((Defuse(), TopologicalSort())).run(model)
    defused = flatbuffer.to_bytes(model)
    for delegate in ("none", "xnnpack", "ref"):
        out[f"defused {delegate}"] = measure(data, defused, delegate)
    wrong = off_by(data)
    out["off by 1e-3"] = (
        measure(data, wrong) if wrong is not None else {"skipped": "its first output is all zero"}
    )
    return out


def sources(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    found: list[tuple[str, bytes]] = []
    if not args.no_zoo:
        import keras

        from tflfuse.examples import zoo

        for name in ZOO:
            log(f"zoo {name}: build")
            keras.utils.set_random_seed(1)  # the same weights every run
            found.append((f"keras {name}", zoo.to_tflite(zoo.build(name))))
    for name in ("mobilenet_v2", "encoder", "yolov8n"):
        path = PYTORCH / f"{name}.tflite"
        if path.is_file():
            found.append((f"litert-torch {name} (../shared)", path.read_bytes()))
    corpus = Path(args.corpus) if args.corpus else None
    for name in CORPUS_MODELS if corpus else ():
        path = corpus / f"{name}.tflite"
        if not path.is_file():
            continue
        model = flatbuffer.load(path)
        for g in model.subgraphs:
            roundoff.widen_float16_weights(g)
        found.append((name, flatbuffer.to_bytes(model)))
        if name == "mobilenet_v3_small.litert":
            found.append((f"{name}, logits x16", _logits_times_16(model)))
    return found


def _logits_times_16(model: Any) -> bytes:
    """The classifier's last FULLY_CONNECTED scaled by 16 (exact): logits of the size a trained
    model gives (random weights give logits near 1), where an absolute 1e-5 refused the exact
    rewrites (the issue's MobileNetV3-Small: 3.72e-5 allowed 1e-5)."""
    fc = [op for op in model.main.ops if op.type == "FULLY_CONNECTED"][-1]
    for t in fc.inputs[1:]:
        if t is not None and t.is_constant:
            t.data = t.data * np.float32(16)
    return flatbuffer.to_bytes(model)


def render(rows: list[tuple[str, dict[str, Any]]], minutes: float) -> str:
    k, eta, floor = roundoff.K, roundoff.ETA, roundoff.FLOOR_FACTOR
    lines = [
        "# The float tolerance on real models",
        "",
        f"Generated by `python benchmarks/roundoff_bench.py` ({minutes:.1f} min). Each cell:"
        " the largest |difference| against the input model over 3 seeded inputs, and in"
        " brackets that difference over its round-off bound"
        f" (`tflfuse/verification/roundoff.py`: K = {k:g}, ETA = {eta:.4g}, floor {floor:g} u"
        " depth |y|; above 1 is refused). Exact"
        " rewrites (the targets' pipelines, the model defused) must stay below 1; the model"
        " with its first output's largest channel off by 1e-3 relative must stand above it.",
        "",
        "| model | " + " | ".join(CASES) + " |",
        "|---|" + "---:|" * len(CASES),
    ]
    worst_exact, least_off = 0.0, float("inf")
    for name, r in rows:
        cells = []
        for case in CASES:
            c = r.get(case, {})
            if "error" in c or "skipped" in c:
                cells.append(c.get("error") or c.get("skipped"))
                continue
            if c.get("identical"):
                cells.append("identical")
            else:
                cells.append(f"{c['max_abs']:.3g} ({c['ratio']:.3g})")
            if case == "off by 1e-3":
                least_off = min(least_off, c["ratio"])
            else:
                worst_exact = max(worst_exact, c["ratio"])
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Worst exact case: {worst_exact:.3g} of its bound. Smallest one-channel error:"
        f" {least_off:.3g} times its bound.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=os.environ.get("TFLFUSE_CORPUS"), help="corpus folder")
    p.add_argument("--no-zoo", action="store_true", help="skip the Keras zoo (no TensorFlow)")
    p.add_argument("--results", default=str(HERE / "ROUNDOFF.md"))
    args = p.parse_args(argv)
    started = time.perf_counter()
    rows = []
    for name, data in sources(args):
        log(f"{name}: measure")
        try:
            rows.append((name, cases(data)))
        except TflfuseError as exc:
            rows.append((name, {case: {"error": str(exc)[:60]} for case in CASES}))
    Path(args.results).write_text(render(rows, (time.perf_counter() - started) / 60))
    log(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
