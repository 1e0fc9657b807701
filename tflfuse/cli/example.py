"""`tflfuse example NAME -o MODEL.keras`: an offline example model (tflfuse.examples) and its
calibration data, every destination checked before the work.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from tflfuse.cli.commands import SIZE_MAX
from tflfuse.errors import UsageError
from tflfuse.examples import digits, zoo
from tflfuse.files import check_destination

_UNSIZED = ("digits_cnn", "transformer_encoder", "ds_cnn")  # fixed input shapes


def _example_outputs(args: argparse.Namespace) -> dict[str, Path]:
    """{what: path} of the files `example` writes, checked before any work: a one-line error
    for a wrong suffix, a destination that cannot be written, or (without --force) a file
    that exists."""
    out = Path(args.output)
    if out.suffix != ".keras":
        raise UsageError(f"{out}: the example is saved as a .keras file")
    outputs = {"model": out}
    if args.calib:
        if Path(args.calib).suffix != ".npy":
            raise UsageError(f"{args.calib}: --calib writes a .npy file")
        outputs["calibration data"] = Path(args.calib)
    if args.name == "digits_cnn":
        outputs["held-out set"] = out.with_name(out.stem + "_test.npz")
    for what, path in outputs.items():
        check_destination(path, what)
        if not args.force and (path.exists() or path.is_symlink()):
            raise UsageError(f"{path}: exists (pass --force to replace it)")
    return outputs


def run(args: argparse.Namespace) -> int:
    if args.name not in _UNSIZED and not 1 <= args.size <= SIZE_MAX:
        raise UsageError(f"--size must be between 1 and {SIZE_MAX}, not {args.size}")
    outputs = _example_outputs(args)
    out = outputs["model"]
    if args.name == "digits_cnn" and importlib.util.find_spec("sklearn") is None:
        raise UsageError(
            "example digits_cnn trains on scikit-learn's digits: pip install scikit-learn"
        )
    if args.name == "digits_cnn":
        split = digits.load_split()
        model = digits.train_cnn(split)
        calib = split.x_train
        test_npz = outputs["held-out set"]
        with test_npz.open("wb") as f:  # np.savez would add .npz to a name without it
            np.savez(f, x=split.x_test, y=split.y_test)
        acc = digits.accuracy(model.predict(split.x_test, verbose=0), split.y_test)
        print(f"trained on sklearn digits: test accuracy {acc:.3f}; held-out set in {test_npz}")
    else:
        model = _zoo_example(args.name, args.size)
        calib = zoo.sample_inputs(tuple(model.input_shape[1:]), n=64, seed=3)
    model.save(out)
    print(f"{out}: {args.name}, input {list(model.input_shape)}")
    if args.calib:
        np.save(args.calib, calib)
        print(f"{args.calib}: {len(calib)} calibration samples")
    return 0


def _zoo_example(name: str, size: int) -> Any:
    """The zoo model, or a one-line error where Keras cannot build it at `size`."""
    zoo.seed(0)  # weights=None: the same example on every run
    try:
        return zoo.build(name, **({} if name in _UNSIZED else {"input_size": size}))
    except ValueError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--size {size}: {name} cannot be built that small ({why})") from None
