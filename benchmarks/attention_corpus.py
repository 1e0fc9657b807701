#!/usr/bin/env python3
"""Build the attention corpus of issue 25: YOLO26n / YOLO11n and timm ViTs, exported by the
routes their users take in 2026, each with image-like calibration data in its own layout.

Runs in an export venv outside the repo (never tflfuse's venv, never importing tflfuse), with a
second venv for onnx2tf 2.6 (Python >= 3.12), called as a subprocess:

    pyenv's 3.11 -m venv /work/venvs/export
    /work/venvs/export/bin/pip install torch==2.14.1 torchvision==0.29.1   # CPU wheels, local
    /work/venvs/export/bin/pip install 'ultralytics==8.4.*' litert-torch timm onnx onnxruntime \\
        'onnx2tf==1.28.*' 'tensorflow==2.21.*' tf_keras onnx_graphsurgeon sng4onnx onnxslim
    pyenv's 3.12 -m venv /work/venvs/onnx2tf26
    /work/venvs/onnx2tf26/bin/pip install 'onnx2tf==2.6.*' (and what it asks for)
    YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False nice /work/venvs/export/bin/python \\
        benchmarks/attention_corpus.py [-o /work/corpus] [--only NAME ...] [--list] [--force]

Cells (MODEL.ROUTE; every file lands in the output folder with NAME.json and NAME.calib.npy):
- YOLO11n and YOLO26n, detect / seg / pose, at 320 and 640 pixels, from Ultralytics' yaml
  (random weights; BatchNorm statistics averaged over forward passes on image-like inputs, so
  the outputs vary with the input):
  - `edgetpu`: `YOLO(yaml).export(format="edgetpu", imgsz=S, data=LOCAL.yaml)`, Ultralytics'
    Coral route: ONNX, then onnx2tf 1.28 with int8 calibration from the local images, then the
    Edge TPU compiler, absent here, which stops it. onnx2tf has already written
    `*_full_integer_quant.tflite` (the user's int8: `NAME.edgetpu-int8.tflite`) and
    `*_float32.tflite` (`NAME.edgetpu-float32.tflite`, NHWC input, what tflfuse converts).
    onnx2tf 1.28 downloads a calibration sample unless one lies in its working folder: one is
    written there.
  - `litert`: `YOLO(yaml).export(format="tflite", imgsz=S)`: in Ultralytics 8.4 this goes
    through litert-torch (NCHW input, float).
- timm classifiers and hybrids (`pretrained=False`, BatchNorm averaged likewise), and
  torchvision's MobileNetV3-large; with `--train-steps N` each is first trained for N steps on
  labelled image-like samples (`train_briefly`; default 0: random weights). With random weights
  a 1000-way head's top two logits lie closer than int8 can resolve (DeiT-tiny: median top-1
  margin 0.041, 5 steps of the int8 output, where stock int8's mean error is 0.112), so every
  int8 model, stock included, gave another class than the float one on all 16 of convert's
  check inputs; refitting the head alone on the random features did not help (stock's top-1
  agreement 0.125). N = 300 took 23 s a step for DeiT-tiny on 2 shared cores (not yet run):
  - `litert`: `litert_torch.convert(model, (x,)).export(f)` (NCHW input).
  - `onnx2tf26`: `torch.onnx.export(..., opset 17, dynamo=False)`, then onnx2tf 2.6 in its own
    venv (`onnx2tf -i m.onnx -o out`) -> `*_float32.tflite` (NHWC input).
Calibration: 32 image-like samples (smooth random fields at several scales, a gradient, a little
noise; never uniform noise), seed 11, in [0, 1] for YOLO and ImageNet-normalized for the
classifiers, laid out as the model's input (batch dimension dropped: what `--calib` takes).
Each cell runs in a child process with a timeout; `README.md` in the output folder lists every
file (model, route, input shape, calibration file) and is rewritten after each cell.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")

import corpus_build as cb  # noqa: E402  (its data, BatchNorm and .tflite helpers)

DEFAULT_OUT = Path("/work/corpus")
ONNX2TF26 = Path(os.environ.get("ONNX2TF26_VENV", "/work/venvs/onnx2tf26")) / "bin" / "onnx2tf"
YOLOS = ("yolo11n", "yolo26n")
TASKS = ("", "-seg", "-pose")
SIZES = (320, 640)
# (name, timm or torchvision constructor, input size): ViTs and conv/attention hybrids
CLASSIFIERS = (
    ("deit_tiny_patch16_224", "timm", 224),
    ("vit_tiny_patch16_224", "timm", 224),
    ("mobilevit_xxs", "timm", 256),
    ("levit_128s", "timm", 224),
    ("efficientformer_l1", "timm", 224),
    ("edgenext_xx_small", "timm", 256),
    ("mobilenet_v3_large", "torchvision", 224),
)
# the brief training of the classifiers (`train_briefly`): labels a model can learn from the
# image-like samples themselves, so the calibration and check inputs carry them too
TRAIN_STEPS = 0  # (300 is the run the docstring means; hours on 2 cores for the whole corpus)
TRAIN_BATCH = 8
TRAIN_CLASSES = 12  # dominant colour channel (3) x brightest quadrant (4)
# built first: what other work waits for
FIRST = (
    "yolo11n-320.edgetpu",
    "yolo11n-320.litert",
    "deit_tiny_patch16_224.litert",
    "mobilenet_v3_large.onnx2tf26",
    "mobilevit_xxs.onnx2tf26",
    "edgenext_xx_small.litert",
    "yolo26n-320.edgetpu",
    "yolo26n-320.litert",
    "yolo26n-640.edgetpu",
)


@dataclass
class Cell:
    model: str  # e.g. yolo11n-seg-320, deit_tiny_patch16_224
    route: str  # edgetpu, litert, onnx2tf26
    arch: str  # yaml or constructor name
    size: int

    @property
    def name(self) -> str:
        return f"{self.model}.{self.route}"

    @property
    def yolo(self) -> bool:
        return self.arch.startswith("yolo")

    def spec(self) -> cb.TorchSpec:
        kind = "unit" if self.yolo else "imagenet"
        return cb.TorchSpec(self.model, (1, 3, self.size, self.size), kind, dict, self.arch)


def cells() -> list[Cell]:
    out = []
    for size in SIZES:
        for yolo in YOLOS:
            for task in TASKS:
                for route in ("edgetpu", "litert"):
                    out.append(Cell(f"{yolo}{task}-{size}", route, f"{yolo}{task}.yaml", size))
    for name, _, size in CLASSIFIERS:
        routes = ("onnx2tf26",) if name == "mobilenet_v3_large" else ("litert", "onnx2tf26")
        out += [Cell(name, r, name, size) for r in routes]
    out.sort(key=lambda c: (c.name not in FIRST, FIRST.index(c.name) if c.name in FIRST else 0))
    return out


# ---------------------------------------------------------------- building one cell


def build_module(cell: Cell, train_steps: int = TRAIN_STEPS) -> tuple[Any, Any]:
    """(nn.Module in eval mode, BatchNorm averaged over image-like passes; the YOLO or None).
    Classifiers are first trained for `train_steps` steps (`train_briefly`)."""
    import torch

    torch.manual_seed(0)
    if cell.yolo:
        from ultralytics import YOLO

        yolo = YOLO(cell.arch)
        cb.calibrate_batchnorm(yolo.model, cell.spec())
        return yolo.model, yolo
    if cell.arch == "mobilenet_v3_large":
        import torchvision

        module = torchvision.models.mobilenet_v3_large(weights=None)
    else:
        import timm

        module = timm.create_model(cell.arch, pretrained=False)
    module.corpus_revived = revive_residuals(module)
    module.corpus_trained = train_briefly(module, cell, train_steps) if train_steps else {}
    cb.calibrate_batchnorm(module, cell.spec())
    return module, None


def image_labels(images01: np.ndarray) -> np.ndarray:
    """Each NCHW image's class: its dominant colour channel (3) times its brightest quadrant (4)."""
    channel = images01.mean(axis=(2, 3)).argmax(axis=1)
    gray = images01.mean(axis=1)
    h, w = gray.shape[1] // 2, gray.shape[2] // 2
    quads = [gray[:, :h, :w], gray[:, :h, w:], gray[:, h:, :w], gray[:, h:, w:]]
    return channel * 4 + np.stack([q.mean(axis=(1, 2)) for q in quads], axis=1).argmax(axis=1)


def train_briefly(module: Any, cell: Cell, steps: int) -> dict[str, Any]:
    """Train the whole classifier for `steps` AdamW steps of TRAIN_BATCH fresh image-like samples
    (seeds 5000 + step; never calibration's 11 or evaluation's 99) on `image_labels`, its first
    TRAIN_CLASSES outputs: a random network's logits differ by less than int8 resolves, a trained
    one's top-1 stands out, as a real model's does. Returns what the sidecar records."""
    import torch

    torch.manual_seed(0)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-4, weight_decay=0.0)
    module.train()
    losses, hits = [], []
    for step in range(steps):
        imgs = cb.smooth_images(TRAIN_BATCH, 3, cell.size, cell.size, 5000 + step)
        x = torch.from_numpy(cb.imagenet_normalized(imgs))
        y = torch.from_numpy(image_labels(imgs)).long()
        out = module(x)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]  # distilled: both heads
        loss = sum(torch.nn.functional.cross_entropy(o, y) for o in outs) / len(outs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        hits.append(float((outs[0].argmax(1) == y).float().mean()))
    module.eval()
    tail = max(1, steps // 5)
    return {
        "steps": steps,
        "batch": TRAIN_BATCH,
        "classes": TRAIN_CLASSES,
        "labels": "dominant colour channel x brightest quadrant",
        "loss_first": round(float(np.mean(losses[:tail])), 3),
        "loss_last": round(float(np.mean(losses[-tail:])), 3),
        "train_accuracy_last": round(float(np.mean(hits[-tail:])), 3),
    }


def revive_residuals(module: Any) -> int:
    """Set to 1 the residual branches' scales an untrained network starts at (nearly) zero:
    norm weights initialized to 0 (LeViT's projections) and layer scales at 1e-5 / 1e-6
    (EfficientFormer, EdgeNeXt). Left so, a branch adds nothing and an exporter folds it away
    (litert-torch dropped 9 of LeViT-128S's 11 attention blocks); trained scales are not near 0.
    Returns how many tensors were set."""
    import torch

    count = 0
    with torch.no_grad():
        for name, param in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
            norm = isinstance(owner, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm))
            scale = (
                leaf.startswith("gamma")
                or "layer_scale" in name
                or "LayerScale" in str(type(owner).__name__)
            )
            if ((norm and leaf == "weight") or scale) and float(param.abs().max()) < 1e-3:
                param.fill_(1.0)
                count += 1
    return count


def calib_for(cell: Cell, shape: list[int], n: int = cb.CALIB_SAMPLES) -> np.ndarray:
    """`n` image-like samples laid out as the model's input `shape` (batch dropped)."""
    xs = cb.varied_input((1, 3, cell.size, cell.size), n, 11, cell.spec().kind)
    return cb.to_model_layout(xs, shape).astype(np.float32)


def onnx2tf_sample(folder: Path) -> None:
    """onnx2tf 1.28's calibration sample (it downloads it unless it lies in its working folder)."""
    cb.onnx2tf_sample(folder)


def export_edgetpu(cell: Cell, yolo: Any, work: Path) -> dict[str, Path]:
    """Ultralytics' Coral route, stopped by the missing compiler: the two onnx2tf files."""
    data = cb.yolo_calib_dataset(work / "data", cell.size)
    kpt_shape = getattr(yolo.model.model[-1], "kpt_shape", None)
    if kpt_shape:  # a pose data set names its keypoints' shape (Ultralytics checks it)
        data.write_text(data.read_text() + f"kpt_shape: {list(kpt_shape)}\n")
    onnx2tf_sample(work)
    cwd = os.getcwd()
    os.chdir(work)
    stopped = ""
    try:
        yolo.export(format="edgetpu", imgsz=cell.size, data=str(data), device="cpu", batch=1)
    except Exception as exc:  # the compiler step: expected here
        stopped = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        print(f"export stopped: {stopped}", file=sys.stderr)
    finally:
        os.chdir(cwd)
    found = {}
    for kind, pattern in (("int8", "*_full_integer_quant.tflite"), ("float32", "*_float32.tflite")):
        hits = sorted(work.rglob(pattern))
        if not hits:
            raise RuntimeError(f"format=edgetpu left no {pattern} (it stopped at: {stopped})")
        found[kind] = hits[0]
    return found


def export_litert_yolo(cell: Cell, yolo: Any, work: Path) -> Path:
    cwd = os.getcwd()
    os.chdir(work)
    try:
        made = yolo.export(format="tflite", imgsz=cell.size, device="cpu")
    finally:
        os.chdir(cwd)
    path = work / str(made or "")
    if not made or not path.is_file():
        hits = sorted(work.rglob("*.tflite"))
        if not hits:
            raise RuntimeError(f"format=tflite returned {made!r}")
        path = hits[0]
    return path


def export_litert_torch(cell: Cell, module: Any, work: Path) -> Path:
    import litert_torch
    import torch

    x = torch.from_numpy(calib_for(cell, [1, 3, cell.size, cell.size], 1))
    dest = work / f"{cell.model}.tflite"
    litert_torch.convert(module.eval(), (x,)).export(str(dest))
    return dest


def export_onnx2tf26(cell: Cell, module: Any, work: Path, timeout: float) -> tuple[Path, Path]:
    import torch

    x = torch.from_numpy(calib_for(cell, [1, 3, cell.size, cell.size], 1))
    onnx_path = work / f"{cell.model}.onnx"
    torch.onnx.export(
        module.eval(), (x,), str(onnx_path), opset_version=17, dynamo=False,
        input_names=["input"], output_names=["output"],
    )  # fmt: skip
    onnx2tf_sample(work)
    env = {**os.environ, "PATH": f"{ONNX2TF26.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [str(ONNX2TF26), "-i", onnx_path.name, "-o", "out"],
        cwd=work, capture_output=True, text=True, timeout=timeout, check=False, env=env,
    )  # fmt: skip
    print(proc.stdout[-20000:] + proc.stderr[-20000:], file=sys.stderr)
    made = work / "out" / f"{cell.model}_float32.tflite"
    if not made.is_file():
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "rror" in ln]
        raise RuntimeError(f"onnx2tf 2.6 exit {proc.returncode}: {(lines or ['?'])[-1][:200]}")
    return made, onnx_path


def onnx2tf26_int8(cell: Cell, work: Path, timeout: float) -> tuple[Path | None, str]:
    """onnx2tf 2.6's own int8 (`-oiqt`, calibrated on the image-like NHWC samples, the input's
    normalization already in them): the user's int8 on this route, or why it made none."""
    nhwc = calib_for(cell, [1, cell.size, cell.size, 3], 20)
    np.save(work / "calib_nhwc.npy", nhwc)
    cmd = [str(ONNX2TF26), "-i", f"{cell.model}.onnx", "-o", "out8", "-oiqt"]
    cmd += ["-cind", "input", "calib_nhwc.npy", "[[[[0.0,0.0,0.0]]]]", "[[[[1.0,1.0,1.0]]]]"]
    try:
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"onnx2tf 2.6 -oiqt timed out after {timeout:.0f} s"
    text = proc.stdout + proc.stderr
    print(text[-20000:], file=sys.stderr)
    hits = sorted((work / "out8").glob("*_full_integer_quant.tflite"))
    if hits:
        return hits[0], "made"
    return None, f"onnx2tf 2.6 -oiqt exit {proc.returncode}: {int8_failure(text)}"


def int8_failure(text: str) -> str:
    """The line of onnx2tf's output that says why its int8 failed: the last error or refusal
    other than the generic "flatbuffer_direct fast path failed" it ends with."""
    lines = [ln.strip() for ln in text.splitlines() if "rror:" in ln or "nsupported" in ln]
    named = [ln for ln in lines if "fast path failed" not in ln]
    return ((named or lines or ["?"])[-1])[:240]


def reference(module: Any, cell: Cell) -> tuple[np.ndarray, list[np.ndarray]]:
    """Four NCHW samples and the module's first output on each (the float model's answer)."""
    import torch

    xs = cb.varied_input((1, 3, cell.size, cell.size), cb.SPREAD_SAMPLES, 11, cell.spec().kind)
    outs = []
    with torch.no_grad():
        for x in xs:
            y = module(torch.from_numpy(x[None]))
            y = y[0] if isinstance(y, (tuple, list)) else y
            outs.append(y.detach().numpy().copy())
    return xs, outs


def place(src: Path, dest: Path, cell: Cell, route: str, steps: list[str], extra: dict) -> dict:
    """Copy `src` to `dest` with its calibration file and sidecar; return the sidecar."""
    shutil.copyfile(src, dest)
    io = cb.tflite_io(dest)
    shape = io["inputs"][0]["shape"]
    calib_file = dest.with_suffix(".calib.npy")
    info: dict[str, Any] = {
        "name": dest.stem,
        "file": dest.name,
        "model": cell.model,
        "architecture": cell.arch,
        "route": route,
        "steps": steps,
        "versions": cb.versions(),
        "input_shape": shape,
        "input_dtype": io["inputs"][0]["dtype"],
        **io,
        **extra,
    }
    layout = "NHWC" if len(shape) == 4 and shape[-1] == 3 and shape[1] != 3 else "NCHW"
    info["input_layout"] = layout
    calib = calib_for(cell, shape)
    np.save(calib_file, calib)
    info["calib"] = {
        "file": calib_file.name,
        "shape": list(calib.shape),
        "range": [float(calib.min()), float(calib.max())],
        "data": f"{len(calib)} image-like samples ({cell.spec().kind}), seed 11, {layout}",
    }
    dest.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def float_error(path: Path, cell: Cell, xs: np.ndarray, ref: list[np.ndarray]) -> float | None:
    with contextlib.suppress(Exception):
        shape = cb.tflite_io(path)["inputs"][0]["shape"]
        if cb.tflite_io(path)["inputs"][0]["dtype"] != "float32":
            return None
        return cb.export_error(path, cb.to_model_layout(xs, shape), ref)
    return None


def build(cell: Cell, out: Path, timeout: float, train_steps: int = TRAIN_STEPS) -> list[str]:
    """Export one cell into `out`; return the files written."""
    t0 = time.perf_counter()
    module, yolo = build_module(cell, train_steps)
    if yolo is not None:
        head = module.model[-1]
        head.export = True
    xs, ref = reference(module, cell)
    np.save(out / f"{cell.model}.reference_inputs.npy", xs)
    for i, r in enumerate(ref[:1]):
        np.save(out / f"{cell.model}.reference_output{i}.npy", r)
    written = []
    with tempfile.TemporaryDirectory(prefix=f"acorpus-{cell.model}-") as tmp:
        work = Path(tmp)
        extra = {"torch_output_shape": list(ref[0].shape)}
        extra["residual_scales_set_to_1"] = getattr(module, "corpus_revived", 0)
        extra["trained"] = getattr(module, "corpus_trained", {})
        if cell.route == "edgetpu":
            found = export_edgetpu(cell, yolo, work)
            steps = [f"YOLO({cell.arch}).export(format='edgetpu', imgsz={cell.size}, data=local)"]
            for kind, src in found.items():
                dest = out / f"{cell.model}.edgetpu-{kind}.tflite"
                x = {**extra, "made_by": src.name, "export_seconds": time.perf_counter() - t0}
                x["max_abs_error_vs_torch"] = float_error(src, cell, xs, ref)
                place(src, dest, cell, f"edgetpu-{kind}", steps, x)
                written.append(dest.name)
            return written
        if cell.route == "litert" and yolo is not None:
            src = export_litert_yolo(cell, yolo, work)
            steps = [f"YOLO({cell.arch}).export(format='tflite', imgsz={cell.size})"]
        elif cell.route == "litert":
            src = export_litert_torch(cell, module, work)
            steps = ["litert_torch.convert(model, (x,)).export(f)"]
        else:
            src, onnx_path = export_onnx2tf26(cell, module, work, timeout)
            shutil.copyfile(onnx_path, out / f"{cell.name}.onnx")
            steps = ["torch.onnx.export(opset 17, dynamo=False)", "onnx2tf 2.6 -i m.onnx -o out"]
            int8, why = onnx2tf26_int8(cell, work, min(timeout / 2, 600))
            extra["user_int8"] = why
            if int8 is not None:
                dest8 = out / f"{cell.model}.onnx2tf26-int8.tflite"
                place(int8, dest8, cell, "onnx2tf26-int8", [*steps[:1], "onnx2tf 2.6 -oiqt"], {})
                written.append(dest8.name)
        dest = out / f"{cell.name}.tflite"
        extra["export_seconds"] = round(time.perf_counter() - t0, 1)
        extra["max_abs_error_vs_torch"] = float_error(src, cell, xs, ref)
        place(src, dest, cell, cell.route, steps, extra)
        written.append(dest.name)
    return written


# ---------------------------------------------------------------- index and driver


def write_readme(out: Path) -> None:
    """README.md: every file with its model, route, input shape and calibration file."""
    rows = []
    for side in sorted(out.glob("*.json")):
        if side.name == "index.json":
            continue
        info = json.loads(side.read_text())
        if "file" not in info:
            continue
        err = info.get("max_abs_error_vs_torch")
        rows.append(
            f"| {info['file']} | {info['architecture']} | {info['route']} |"
            f" {info['input_shape']} {info['input_dtype']} {info.get('input_layout', '')} |"
            f" {(info.get('calib') or {}).get('file', '-')} |"
            f" {'-' if err is None else f'{err:.3g}'} | {info.get('ops', '?')} |"
        )
    notes = [
        f"- {json.loads(p.read_text())['file']}: no onnx2tf 2.6 int8 ({why})"
        for p in sorted(out.glob("*.onnx2tf26.json"))
        for why in [json.loads(p.read_text()).get("user_int8")]
        if why and why != "made"
    ]
    index = json.loads((out / "index.json").read_text()) if (out / "index.json").exists() else {}
    skipped = [f"- {k}: {v}" for k, v in sorted(index.get("skipped", {}).items())]
    tried = index.get("skipped", {})
    pending = [c.name for c in cells() if not done(c, out) and c.name not in tried]
    text = [
        "# Attention corpus (issue 25)",
        "",
        "Built by `benchmarks/attention_corpus.py` (branch h-corpus; routes and calibration data"
        " in its docstring). Random weights, BatchNorm averaged over image-like passes. Each"
        " `X.tflite` has `X.json` (versions, I/O, op counts) and `X.calib.npy` (32 image-like"
        " samples in the model's input layout, batch dropped: `--calib` takes it).",
        "`MODEL.reference_inputs.npy` / `MODEL.reference_output0.npy`: 4 NCHW samples and the"
        " PyTorch model's first output on them (the float reference).",
        "",
        "timm models: residual scales an untrained network starts at 0 (zero-initialized"
        " norms, 1e-5 layer scales) are set to 1 first (`revive_residuals`; their count is the"
        " sidecar's `residual_scales_set_to_1`), else exporters fold the branches away.",
        "",
        "Routes: `edgetpu-int8` = Ultralytics `format='edgetpu'` onnx2tf 1.28 full-integer int8"
        " (the user's Coral file); `edgetpu-float32` = the float32 file of the same export;"
        " `litert` = litert-torch float (Ultralytics 8.4 `format='tflite'` for YOLO);"
        " `onnx2tf26` = torch.onnx.export -> onnx2tf 2.6 float32.",
        "",
        "`max abs vs torch`: the export against PyTorch on the reference inputs. YOLO exports"
        " normalize box coordinates by the image size where PyTorch gives pixels, so theirs is"
        " the box scale, not an export error.",
        "",
        "Measured by `benchmarks/yolo_edgetpu.py` (every float file here, with its route's int8"
        " beside it) into `benchmarks/YOLO_EDGETPU.md`; a missing cell is built by running"
        " `attention_corpus.py` again (it resumes).",
        "",
        "| file | model | route | input | calibration | max abs vs torch | ops |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *(["## The user's int8 on the onnx2tf 2.6 route", "", *notes, ""] if notes else []),
        *(["## Not built", "", *skipped, ""] if skipped else []),
        *(["## Not attempted yet", "", ", ".join(pending), ""] if pending else []),
    ]
    (out / "README.md").write_text("\n".join(text) + "\n")


def child(name: str, out: Path, timeout: float, train_steps: int = TRAIN_STEPS) -> int:
    cell = next(c for c in cells() if c.name == name)
    try:
        files = build(cell, out, timeout, train_steps)
        print("RESULT " + json.dumps({"ok": True, "files": files}), flush=True)
        return 0
    except Exception as exc:
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        print("RESULT " + json.dumps({"ok": False, "reason": reason}), flush=True)
        return 1


def done(cell: Cell, out: Path) -> bool:
    if cell.route == "edgetpu":
        return (out / f"{cell.model}.edgetpu-int8.tflite").exists()
    return (out / f"{cell.name}.tflite").exists()


def salvage_float32(cell: Cell, out: Path) -> str:
    """After a failed or timed-out `edgetpu` cell: keep the float32 file onnx2tf wrote before its
    int8 step (what tflfuse converts), from the killed child's working folder; remove the folder.
    Return what was kept, or ""."""
    dirs = sorted(Path(tempfile.gettempdir()).glob(f"acorpus-{cell.model}-*"), key=os.path.getmtime)
    hits = sorted(dirs[-1].rglob("*_float32.tflite")) if dirs else []
    kept = ""
    refs = out / f"{cell.model}.reference_inputs.npy", out / f"{cell.model}.reference_output0.npy"
    if hits and all(p.exists() for p in refs):
        xs, ref = np.load(refs[0])[:1], [np.load(refs[1])]  # the first sample's output is kept
        dest = out / f"{cell.model}.edgetpu-float32.tflite"
        steps = [f"YOLO({cell.arch}).export(format='edgetpu', imgsz={cell.size}, data=local)"]
        extra = {"made_by": hits[0].name, "torch_output_shape": list(ref[0].shape)}
        extra["note"] = "the int8 step did not finish: float32 kept from the export's folder"
        extra["max_abs_error_vs_torch"] = float_error(hits[0], cell, xs, ref)
        place(hits[0], dest, cell, "edgetpu-float32", steps, extra)
        kept = f"kept {dest.name}"
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return kept


def run_child(cmd: list[str], timeout: float) -> tuple[str, dict]:
    """Run one cell's child in its own process group (a timeout ends the whole group: onnx2tf's
    subprocesses too); return its output and its RESULT line."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        return text or "", {"ok": False, "reason": f"timed out after {timeout:.0f} s"}
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("RESULT ")), "")
    return text, json.loads(line[7:]) if line else {"ok": False, "reason": "no result"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="+", help="cell names (MODEL.ROUTE) or models")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--readme", action="store_true", help="rewrite README.md only")
    ap.add_argument(
        "--train-steps", type=int, default=TRAIN_STEPS,
        help="steps of the classifiers' brief training (0: random weights, as before)",
    )  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args.child, args.out, args.timeout, args.train_steps)
    todo = [c for c in cells() if not args.only or c.name in args.only or c.model in args.only]
    if args.only:  # in the order given
        rank = {name: i for i, name in enumerate(args.only)}
        todo.sort(key=lambda c: rank.get(c.name, rank.get(c.model, 0)))
    if args.list:
        print("\n".join(c.name for c in todo))
        return 0
    if args.readme:
        write_readme(args.out)
        return 0
    index_path = args.out / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"skipped": {}}
    for i, cell in enumerate(todo, 1):
        head = f"[{i}/{len(todo)}] {cell.name}"
        if done(cell, args.out) and not args.force:
            print(f"{head}: exists", flush=True)
            continue
        t0 = time.perf_counter()
        log = args.out / "logs" / f"{cell.name}.log"
        log.parent.mkdir(exist_ok=True)
        cmd = [sys.executable, __file__, "-o", str(args.out), "--child", cell.name]
        cmd += ["--train-steps", str(args.train_steps)]
        text, result = run_child(cmd, args.timeout)
        if not result["ok"] and cell.route == "edgetpu":
            kept = salvage_float32(cell, args.out)
            result["reason"] += f" ({kept})" if kept else ""
        log.write_text(text)
        if result["ok"]:
            index["skipped"].pop(cell.name, None)
            print(f"{head}: {result['files']} in {time.perf_counter() - t0:.0f} s", flush=True)
        else:
            index["skipped"][cell.name] = result["reason"]
            print(f"{head}: skipped: {result['reason']} (log: {log})", flush=True)
        index_path.write_text(json.dumps(index, indent=1) + "\n")
        write_readme(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
