"""Whether a compiled model is a compile of a given CPU model: `check --twin` compares the two only
when it is.

The compiler replaces the ops it maps by `edgetpu-custom-op`s and copies every other op unchanged,
output tensor names included (`tflfuse.targets.edgetpu.truth`). So every tensor the compiled model
keeps (the model's inputs and outputs, the custom ops' inputs and outputs, the CPU ops' tensors)
is a tensor of the CPU model: the same name, shape, type and quantization. A compiled model of
another network fails on its first tensor; a compile that mapped nothing (no custom op: the
compiler found no op it could take) passes, tensor for tensor.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Model, Tensor


def _quant(t: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    q = t.quantization
    if q is None or q.scale is None or np.size(q.scale) == 0:
        return None
    zero = q.zero_point if q.zero_point is not None else np.zeros(np.size(q.scale))
    return np.ravel(q.scale).astype(np.float64), np.ravel(zero).astype(np.int64)


def _same_quant(a: Tensor, b: Tensor) -> bool:
    qa, qb = _quant(a), _quant(b)
    if qa is None or qb is None:
        return qa is qb
    return (
        qa[0].shape == qb[0].shape
        and bool(np.allclose(qa[0], qb[0], rtol=1e-6, atol=0.0))
        and bool(np.array_equal(qa[1], qb[1]))
    )


def _kept(compiled: Model) -> list[Tensor]:
    """The tensors the compiled model uses, in order: its inputs, outputs, then every op's."""
    g = compiled.main
    seen: dict[int, Tensor] = {}
    for t in (*g.inputs, *g.outputs):
        seen.setdefault(id(t), t)
    for op in g.ops:
        for u in (*op.inputs, *op.outputs):
            if u is not None:
                seen.setdefault(id(u), u)
    return list(seen.values())


def mismatch(model: Model, compiled: Model) -> str | None:
    """Why `compiled` is not a compile of `model` (the first tensor that differs), or None."""
    g, c = model.main, compiled.main
    names = {t.name: t for t in g.tensors}
    outputs = {t.name for t in g.outputs}
    if [t.name for t in c.inputs] != [t.name for t in g.inputs] or not all(
        t.name in outputs for t in c.outputs
    ):  # (an output no op writes may be dropped: seen on a real pair)
        return (
            f"its inputs and outputs are {[t.name for t in (*c.inputs, *c.outputs)]},"
            f" the model's {[t.name for t in (*g.inputs, *g.outputs)]}"
        )
    for t in _kept(compiled):
        mine = names.get(t.name)
        if mine is None:
            return f"its tensor {t.name!r} is not in the model"
        if tuple(mine.shape) != tuple(t.shape) or mine.dtype != t.dtype:
            return (
                f"tensor {t.name!r} is {t.dtype.lower()}{list(t.shape)} there,"
                f" {mine.dtype.lower()}{list(mine.shape)} in the model"
            )
        if not _same_quant(mine, t):
            return f"tensor {t.name!r} is quantized differently there"
    return None
