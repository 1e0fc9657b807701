"""Calibration data for quantization: arrays, .npy/.npz files, a folder of images or a callable.

Whatever the source, the result is one float32 array per model input, shaped (N, *input shape
without batch), checked (shape, dtype, and NaN/Inf in the float32 values actually used: a float64
1e300 overflows to inf in the cast), and reduced to a seeded subset of the recipe's
sample count, so the same seed gives the same quantized model. Images are decoded and resized with
TensorFlow (imported lazily), then scaled as the recipe says: x / 255 * scale + offset, and laid
out for the model's input: (H, W, C), or (C, H, W) for a channels-first input such as a PyTorch
export's [1, 3, H, W] (`image_layout`). Arrays are taken in the model's own layout, as given.
An .npz holding several arrays is read as `FILE.npz:NAME` (or `FILE.npz:NAME1,NAME2` for a
model with several inputs, in input order).
"""

from __future__ import annotations

import re
import stat
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tflfuse.errors import TflfuseError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
# an ndarray (or a list of one per input), an iterable of samples, a .npy/.npz path, an image
# folder, a callable that returns one of these, or None
CalibrationSource = np.ndarray | str | Path | Iterable[object] | Callable[[], object] | None


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(N, " + ", ".join(str(s) for s in shape) + ")"


def check_array(data: npt.ArrayLike, shape: tuple[int, ...], what: str) -> np.ndarray:
    """`data` as float32 (N, *shape), or a one-line error saying what is wrong with it."""
    arr = np.asarray(data)
    if arr.dtype == object or arr.dtype.kind not in "fiub":
        raise TflfuseError(f"{what}: calibration data of dtype {arr.dtype} is not numeric")
    if arr.dtype.kind in "iub" and arr.dtype != np.float32:
        raise TflfuseError(
            f"{what}: calibration data has dtype {arr.dtype}, the model input is float32"
            " (scale it to the model's input range first, or give a folder of images)"
        )
    if arr.ndim == len(shape) + 2 and arr.shape[1] == 1:
        arr = arr[:, 0]  # (N, 1, ...) batches of one
    if arr.ndim == len(shape):
        arr = arr[None]
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != tuple(shape):
        raise TflfuseError(
            f"{what}: calibration data has shape {tuple(arr.shape)}, the model input needs"
            f" {_shape_text(shape)}"
        )
    if arr.shape[0] == 0:
        raise TflfuseError(f"{what}: calibration data is empty")
    given_finite = np.isfinite(arr)
    with np.errstate(over="ignore", invalid="ignore"):
        used = np.ascontiguousarray(arr, dtype=np.float32)  # what calibration will see
    bad = int(np.count_nonzero(~np.isfinite(used)))
    if bad:
        overflow = int(np.count_nonzero(given_finite & ~np.isfinite(used)))
        if overflow:
            largest = float(np.max(np.abs(arr[given_finite])))
            raise TflfuseError(
                f"{what}: calibration data has {overflow} value{'s' if overflow != 1 else ''}"
                " beyond float32's range"
                f" (largest |x| {largest:.3g}; the model computes in float32, max 3.4e+38)"
            )
        raise TflfuseError(f"{what}: calibration data has {bad} NaN or Inf values")
    return used


def _from_npz(path: Path, names: list[str], picked: list[str] | None = None) -> list[Any]:
    """The arrays for the model inputs `names`: the ones `picked` (FILE.npz:NAME), else the one
    array of the file, else the arrays named after the inputs."""
    with np.load(path, allow_pickle=False) as z:
        keys = list(z.files)
        if not keys:
            raise TflfuseError(f"{path}: the .npz holds no arrays")
        if picked is not None:
            missing = [k for k in picked if k not in keys]
            if missing:
                raise TflfuseError(
                    f"{path}: no array named {missing[0]!r} (it holds {_listing(keys)})"
                )
            if len(picked) != len(names):
                raise TflfuseError(
                    f"{path}: {len(picked)} arrays picked for {len(names)} model inputs"
                    f" ({', '.join(names)})"
                )
            return [z[k] for k in picked]
        if len(names) == 1:
            key = names[0] if names[0] in keys else keys[0]
            if len(keys) > 1 and names[0] not in keys:
                raise TflfuseError(
                    f"{path}: {len(keys)} arrays ({_listing(keys)}); pick one as"
                    f" {path}:{keys[0]} (or name it after the model input {names[0]!r})"
                )
            return [z[key]]
        missing = [n for n in names if n not in keys]
        if missing:
            raise TflfuseError(f"{path}: no array named {missing[0]!r} (model inputs: {names})")
        return [z[n] for n in names]


def _listing(keys: list[str]) -> str:
    return ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")


def split_pick(source: str) -> tuple[Path, list[str] | None]:
    """`FILE.npz:NAME[,NAME...]` -> (FILE.npz, [NAME, ...]); any other text -> (path, None).
    A file that really is named with a colon wins over the split."""
    match = re.fullmatch(r"(.+\.np[yz]):([^:/\\]+)", source, flags=re.IGNORECASE)
    if match is None or Path(source).exists():
        return Path(source), None
    picked = [k.strip() for k in match.group(2).split(",")]
    if not all(picked):
        raise TflfuseError(f"{source}: empty array name after {match.group(1)}:")
    return Path(match.group(1)), picked


# what numpy raises for an empty, truncated or corrupt .npy/.npz
_NUMPY_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError)


# how each file starts: NumPy's .npy header, and the zip archive an .npz is
_MAGIC = {".npy": b"\x93NUMPY", ".npz": b"PK\x03\x04"}


def _check_magic(path: Path, kind: str) -> None:
    """A one-line error for a file that is no .npy/.npz at all (np.load calls a file without
    the .npy header "pickled", whatever it holds)."""
    magic = _MAGIC.get(kind)
    if magic is None:
        return
    with path.open("rb") as f:
        head = f.read(len(magic))
    if head != magic and not (kind == ".npz" and head.startswith(b"PK")):
        kinds = {".npy": "NumPy .npy header", ".npz": "zip archive (.npz)"}
        raise TflfuseError(
            f"{path}: not a readable {kind} file: no {kinds[kind]} (it starts with {head!r})"
        )


def _read_numpy(path: Path, names: list[str], picked: list[str] | None = None) -> list[Any]:
    """The arrays of a .npy or .npz file, or a one-line error saying why it cannot be read."""
    kind = path.suffix.lower()
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO would block, a device read without end
        raise TflfuseError(f"{path}: not a regular file; calibration data must be a {kind} file")
    if path.stat().st_size == 0:
        raise TflfuseError(f"{path}: not a readable {kind} file: the file is empty")
    if picked is not None and kind != ".npz":
        raise TflfuseError(f"{path}: FILE:NAME picks an array of an .npz, not of a {kind} file")
    _check_magic(path, kind)
    try:
        if kind == ".npy":
            return [np.load(path, allow_pickle=False)]
        return _from_npz(path, names, picked)
    except TflfuseError:
        raise
    except _NUMPY_READ_ERRORS as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = "".join(c if c.isprintable() else "?" for c in detail)[:160]
        if isinstance(exc, (EOFError, zipfile.BadZipFile, zlib.error)):
            detail = f"truncated or corrupt ({detail})"
        raise TflfuseError(f"{path}: not a readable {kind} file: {detail}") from None


def image_layout(shape: tuple[int, ...]) -> str:
    """ "NCHW" when an image input (without batch) is channels-first: its first axis holds 1 or 3
    channels and its last does not (a PyTorch export's (3, H, W)); else "NHWC"."""
    if len(shape) == 3 and shape[0] in (1, 3) and shape[-1] not in (1, 3):
        return "NCHW"
    return "NHWC"


def _from_images(folder: Path, shape: tuple[int, ...], scale: float, offset: float) -> np.ndarray:
    files = sorted(
        p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )
    if not files:
        raise TflfuseError(
            f"{folder}: no images in the calibration folder ({', '.join(IMAGE_SUFFIXES)})"
        )
    if len(shape) != 3:
        raise TflfuseError(
            f"{folder}: images need a model input of shape (H, W, C) or (C, H, W), not {shape}"
        )
    import tensorflow as tf  # decodes the images; only a folder of images needs it

    layout = image_layout(shape)
    if layout == "NCHW":
        channels, height, width = shape
    else:
        height, width, channels = shape
    out = []
    for path in files:
        try:
            image = tf.io.decode_image(
                path.read_bytes(), channels=channels, expand_animations=False
            )
        except OSError as exc:
            raise TflfuseError(f"{path}: cannot read image: {exc.strerror or exc}") from None
        except tf.errors.OpError as exc:
            raise TflfuseError(f"{path}: cannot decode image: {_tf_message(exc)}") from None
        image = tf.image.resize(tf.cast(image, tf.float32), (height, width))
        value = image.numpy() / 255.0 * scale + offset
        out.append(value.transpose(2, 0, 1) if layout == "NCHW" else value)
    return np.stack(out).astype(np.float32)


def _tf_message(exc: Exception) -> str:
    """A TensorFlow op error without its internals ("{{function_node ...}}", "[Op:...]")."""
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"\{\{[^}]*\}\}", "", text)
    text = re.sub(r"\[Op:[^\]]*\].*", "", text, flags=re.DOTALL)
    text = " ".join(text.split()).strip(" .;:")
    return (text or "not an image") + " (a corrupt or unsupported image?)"


def load(
    source: CalibrationSource,
    shapes: list[tuple[int, ...]],
    names: list[str],
    *,
    samples: int = 100,
    seed: int = 0,
    scale: float = 2.0,
    offset: float = -1.0,
) -> list[np.ndarray] | None:
    """One checked float32 array per model input (None when `source` is None)."""
    if source is None:
        return None
    what = "calibration"
    raw: list[Any]
    if callable(source) and not isinstance(source, (str, Path)):
        what = getattr(source, "__name__", "calibration callable")
        produced = source()
        raw = _collect(produced, len(shapes), what)
    elif isinstance(source, (str, Path)):
        path, picked = split_pick(str(source)) if isinstance(source, str) else (source, None)
        what = str(source)
        try:
            exists, is_dir = path.exists(), path.is_dir()
        except OSError as exc:  # e.g. a name too long
            raise TflfuseError(f"{path}: {exc.strerror or exc}") from None
        if is_dir:
            if len(shapes) != 1:
                raise TflfuseError(
                    f"{path}: a folder of images calibrates single-input models only"
                )
            raw = [_from_images(path, shapes[0], scale, offset)]
        elif not exists:
            raise TflfuseError(f"{path}: calibration data not found")
        elif path.suffix.lower() in (".npy", ".npz"):
            raw = _read_numpy(path, names, picked)
        else:
            raise TflfuseError(f"{path}: calibration data must be .npy, .npz or a folder of images")
    else:
        raw = _collect(source, len(shapes), what)
    if len(raw) != len(shapes):
        raise TflfuseError(f"{what}: {len(raw)} calibration arrays for {len(shapes)} model inputs")
    arrays = [
        check_array(a, s, f"{what} (input {n!r})" if len(shapes) > 1 else what)
        for a, s, n in zip(raw, shapes, names)
    ]
    counts = {len(a) for a in arrays}
    if len(counts) != 1:
        raise TflfuseError(f"{what}: calibration arrays have different sample counts {counts}")
    n = counts.pop()
    if n > samples:
        keep = np.sort(np.random.default_rng(seed).choice(n, samples, replace=False))
        arrays = [a[keep] for a in arrays]
    return arrays


def _collect(produced: Any, n_inputs: int, what: str) -> list[Any]:
    """Arrays from an ndarray, a list of per-input arrays, or an iterable of samples."""
    if isinstance(produced, np.ndarray):
        return [produced]
    if (
        isinstance(produced, (list, tuple))
        and produced
        and all(isinstance(a, np.ndarray) for a in produced)
        and len(produced) == n_inputs
        and n_inputs > 1
    ):
        return list(produced)
    if isinstance(produced, Iterable):
        samples = [s if isinstance(s, (list, tuple)) else [s] for s in produced]
        if not samples:
            raise TflfuseError(f"{what}: the calibration callable produced no samples")
        return [np.stack([np.asarray(s[i]) for s in samples]) for i in range(len(samples[0]))]
    raise TflfuseError(f"{what}: calibration must be arrays or an iterable of samples")
