#!/usr/bin/env python3
"""Does this interpreter run these models? Load, allocate and invoke each, and say which step
failed in the interpreter's own words: the real answer that `tflfuse check --runtime` predicts.

Needs only Python >= 3.7, numpy and one interpreter package (tflite_runtime, ai_edge_litert or
TensorFlow's tf.lite); no tflfuse:

    python3 try_models.py model.tflite other.tflite          # one JSON line per model
    python3 try_models.py --construct-only probe_*.tflite    # only build the interpreter

Each line: {"model", "ok", "stage" (load, allocate, invoke or done), "error" (first line of the
interpreter's message, or null)}; a first line {"interpreter": {"package", "version"}} says who
answered. Exit status 0 when every model ran, 1 when one did not, 2 for bad usage.
"""

import argparse
import importlib
import json
import sys

PACKAGES = {
    "tflite_runtime": "tflite_runtime.interpreter",
    "ai_edge_litert": "ai_edge_litert.interpreter",
    "tensorflow": "tensorflow.lite.python.interpreter",
}


def interpreter_module(package):
    """(the interpreter module, package name, version) of `package` or the first installed."""
    names = [package] if package else list(PACKAGES)
    for name in names:
        try:
            module = importlib.import_module(PACKAGES[name])
        except ImportError:
            continue
        top = importlib.import_module(name)
        version = getattr(top, "__version__", None)
        if version is None and name == "tensorflow":
            version = getattr(getattr(top, "version", None), "VERSION", None)
        return module, name, version or "unknown"
    tried = ", ".join(names)
    raise SystemExit(f"try_models: error: no interpreter package (tried {tried})")


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def sample(detail, rng):
    import numpy as np

    shape = [max(int(d), 1) for d in detail["shape"]]
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = max(int(info.min), -128), min(int(info.max), 127)
        return rng.randint(low, high + 1, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.randint(0, 2, shape).astype(dtype)
    return np.zeros(shape, dtype)


def try_model(module, path, construct_only, seed):
    import numpy as np

    stage = "load"
    try:
        interp = module.Interpreter(model_path=path)
        if construct_only:
            return {"model": path, "ok": True, "stage": "done", "error": None}
        stage = "allocate"
        interp.allocate_tensors()
        stage = "invoke"
        rng = np.random.RandomState(seed)
        for detail in interp.get_input_details():
            interp.set_tensor(detail["index"], sample(detail, rng))
        interp.invoke()
        for detail in interp.get_output_details():
            interp.get_tensor(detail["index"])
    except Exception as exc:  # the interpreter's refusal is the answer
        return {"model": path, "ok": False, "stage": stage, "error": first_line(exc)}
    return {"model": path, "ok": True, "stage": "done", "error": None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help=".tflite files")
    p.add_argument("--package", choices=sorted(PACKAGES), help="interpreter package to use")
    p.add_argument("--construct-only", action="store_true", help="only build the interpreter")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    module, name, version = interpreter_module(args.package)
    print(json.dumps({"interpreter": {"package": name, "version": version}}), flush=True)
    failed = 0
    for path in args.models:
        result = try_model(module, path, args.construct_only, args.seed)
        failed += not result["ok"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
