"""How far float32 round-off alone can move each output of a model: the tolerance of a rewrite
that is exact in real arithmetic.

Folding a BatchNorm into a conv, merging two linear convs, splitting a bias into its own ADD or
re-ordering a sum computes the same real function and a different float32 one: sums are
re-associated and other intermediate values are rounded. How far that moves an output depends on
the output's magnitude and on the arithmetic between the input and it (how long the sums are, how
much every later layer amplifies, how much cancels), so no single absolute tolerance fits: 1e-5
refuses a MobileNetV3 whose logits moved by 4e-5 through exact folds, and lets a one-channel
error of 1e-3 relative through on an output of magnitude 1e-3.

Derivation. Whatever the order of summation, and with or without fused multiply-adds, a float32
dot product is the exact dot product of slightly perturbed weights (backward error, Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1):

    fl(sum_i w_i x_i) = sum_i w_i x_i (1 + theta_i),   |theta_i| <= gamma_n = n u / (1 - n u),

with u = 2^-24 the unit round-off of float32 and n the number of products summed. So an exact
rewrite's result and the reference are both the exact function of the model with each weight
perturbed relatively by at most gamma_n, and their difference is the difference of two such
perturbed models. What an analytical bound cannot see cheaply - the gain of every path from a
weight to an output, the cancellation in every later sum - the interpreter measures: the model is
run again with every float32 constant w multiplied by (1 + rho eps), eps = +-1 at random, and

    rho = u sqrt(n)     (n: products summed by the op reading w: kh kw cin for a conv, kh kw for
                         a depthwise conv, cin for a fully connected layer, 1 for a bias or an
                         elementwise constant)

the size random rounding errors reach in an n-term sum (the probabilistic bound of Higham and
Mary, SIAM J. Sci. Comput. 41(5), 2019, sqrt(n) u where the worst case is n u). The change of each
output element, the largest over the check inputs and `COPIES` perturbed copies, is its
round-off noise `noise_e`: a sample of what re-associating the arithmetic behind it can do, with
every amplification on the way included. The bound is

    bound_e = K * max(noise_e, ETA * max_e' noise_e') + FLOOR_FACTOR * u * depth * |r_e| + u * s

  K = 8          two rewrites' round-off against one perturbation (x2), a sample maximum against
                 the tail of the distribution (x2), and a worst case over random rounding (x2);
  ETA = 1/64     an element whose samples happened to be small (a ReLU near zero, a sum that
                 cancelled) still gets a share of its tensor's noise;
  the floor      each op on the longest path from an input (`depth` ops) rounds its result once
                 (a few ulp for a transcendental function): what is left for arithmetic without
                 float constants (elementwise chains), with one ulp of the output's scale s
                 (its largest magnitude) for elements that cancelled to nearly nothing.

Measured (benchmarks/ROUNDOFF.md: Keras applications, litert-torch exports, MediaPipe landmark
models): exact rewrites and defused models, on the plain kernels and on XNNPACK, stay below a
fifth of this bound (the MediaPipe pose model's defused 9.3 on an output of scale 1600 included),
while the largest output channel off by 1e-3 relative stands 3.6 to 115 times above it. A
channel whose own round-off noise is above 1e-4 of its magnitude cannot be told from round-off
by any sound rule, and is not. Integer tensors are not perturbed: an int8 model's float outputs
get the floor only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tflfuse.errors import TflfuseError
from tflfuse.ir import Graph, Model, Op, flatbuffer
from tflfuse.json_types import JSONDict
from tflfuse.verification.runs import run

U = 2.0**-24  # unit round-off of float32
K = 8.0
ETA = 1.0 / 64.0
FLOOR_FACTOR = 4.0
COPIES = 2

# inputs of these ops that hold the products summed: (op, input index) -> axes summed over
_SUMMED_AXES = {
    ("CONV_2D", 1): (1, 2, 3),
    ("CONV_3D", 1): (0, 1, 2, 3),
    ("DEPTHWISE_CONV_2D", 1): (1, 2),
    ("FULLY_CONNECTED", 1): (1,),
    ("TRANSPOSE_CONV", 1): (1, 2, 3),
}
# ops whose float inputs decide a shape (RANGE's start, limit and delta): never perturbed
_SHAPE_OPS = frozenset({"RANGE"})


@dataclass
class RoundOff:
    """Per-output round-off bounds (by output tensor name, each an array of the output's shape)
    and what they were made of, for the verification record."""

    bounds: dict[str, np.ndarray] = field(default_factory=dict)
    noise: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> JSONDict:
        return {
            "model": "float32 round-off (tflfuse.verification.roundoff)",
            "outputs": self.summary,
        }


def products_summed(op: Op, index: int) -> int:
    """n of the derivation: how many products the op sums for one output from input `index`."""
    t = op.inputs[index]
    axes = _SUMMED_AXES.get((op.type, index))
    if op.type == "BATCH_MATMUL" and index in (0, 1) and t is not None and len(t.shape) >= 2:
        adj = op.options.get("adj_x" if index == 0 else "adj_y", False)
        axis = (-2 if adj else -1) if index == 0 else (-1 if adj else -2)
        return max(int(t.shape[axis]), 1)
    if axes is None or t is None:
        return 1
    return max(int(np.prod([t.shape[a] for a in axes if a < len(t.shape)])), 1)


def _float_constants(graph: Graph) -> dict[Any, float]:
    """{constant float32 tensor: rho} for every constant an arithmetic op reads; a constant read
    by several ops takes the largest rho."""
    rho: dict[Any, float] = {}
    for op in graph.ops:
        if op.type in _SHAPE_OPS:
            continue
        for i, t in enumerate(op.inputs):
            if t is None or not t.is_constant or t.dtype != "FLOAT32" or t.is_raw:
                continue
            rho[t] = max(rho.get(t, 0.0), U * float(np.sqrt(products_summed(op, i))))
    return rho


def widen_float16_weights(graph: Graph) -> None:
    """DEQUANTIZE(float16 constant) -> the float32 constant it computes (exactly), so the weights
    stored as float16 are perturbed like any other."""
    for op in list(graph.ops):
        src = op.inputs[0] if op.type == "DEQUANTIZE" and op.inputs else None
        if src is None or not src.is_constant or src.dtype != "FLOAT16" or src.is_raw:
            continue
        out = op.outputs[0]
        if graph.is_graph_output(out):
            continue
        graph.remove_op(op)
        out.data = np.asarray(src.data, np.float32).reshape(out.shape)


def perturbed(reference: bytes, seed: int) -> bytes:
    """`reference` with every float32 constant w an op computes with replaced by
    w (1 + rho eps), eps = +-1 drawn from `seed` (see the module docstring)."""
    return _Copies(flatbuffer.from_bytes(reference, "round-off copy")).perturbed(seed)


class _Copies:
    """Perturbed copies of one parsed model (parsed once for all copies): its float16 weights
    widened, its float32 constants and their rho found once; each copy draws its own signs."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.constants: list[tuple[Any, float, np.ndarray]] = []
        for graph in model.subgraphs:
            widen_float16_weights(graph)
            for t, rho in _float_constants(graph).items():
                self.constants.append((t, rho, np.asarray(t.data, np.float32)))

    def perturbed(self, seed: int) -> bytes:
        rng = np.random.default_rng(seed)
        for t, rho, w in self.constants:
            eps = rng.choice(np.array([-1.0, 1.0]), size=w.shape)
            moved = (w.astype(np.float64) * (1.0 + rho * eps)).astype(np.float32)
            t.data = np.where(np.isfinite(moved), moved, w)
        try:
            return flatbuffer.to_bytes(self.model)
        except ValueError as exc:  # an IRError: the copy is the model's own graph, so a bug
            raise TflfuseError(
                f"the perturbed copy of the model could not be written: {exc}"
            ) from None


def depths(model: Model) -> dict[str, int]:
    """{output tensor name: ops on the longest path from a model input (or constant) to it}."""
    graph = model.main
    depth: dict[Any, int] = {}
    for op in graph.ops:
        d = 1 + max((depth.get(t, 0) for t in op.inputs if t is not None), default=0)
        for t in op.outputs:
            depth[t] = d
    return {t.name: depth.get(t, 0) for t in graph.outputs}


def _noise(reference_outputs: Sequence[Sequence[np.ndarray]], copies: Sequence[Any]) -> list:
    """Per output, the elementwise largest |copy - reference| over input sets and copies."""
    worst: list[np.ndarray] = []
    for outputs in copies:
        for r_set, p_set in zip(reference_outputs, outputs):
            for k, (r, p) in enumerate(zip(r_set, p_set)):
                if r.dtype.kind != "f" or r.shape != p.shape:
                    diff = np.zeros(r.shape)
                else:
                    diff = _abs_diff(r, p)
                if k == len(worst):
                    worst.append(diff)
                else:
                    worst[k] = np.maximum(worst[k], diff)
    return worst


def _abs_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float64, 0 where both hold the same infinity or both are NaN."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(a64 - b64))


def _run_alone(
    model: bytes, inputs: list[list[np.ndarray]], delegate: str
) -> list[list[np.ndarray]]:
    return run(model, inputs, delegate, remember=False)  # (a copy is never run twice)


def estimate(
    reference: bytes,
    inputs: list[list[np.ndarray]],
    reference_outputs: list[list[np.ndarray]],
    *,
    names: Sequence[str],
    delegate: str = "none",
    seed: int = 0,
    copies: int = COPIES,
) -> RoundOff:
    """The round-off bound of every float output of `reference` on `inputs` (whose outputs, in
    output-detail order, are `reference_outputs`), named by `names`."""
    key = (
        hashlib.sha256(reference).hexdigest(),
        hashlib.sha256(b"".join(a.tobytes() for one in inputs for a in one)).hexdigest(),
        tuple(names),
        delegate,
        seed,
        copies,
    )
    if _last and _last[0] == key:  # a check re-run on the same reference (blaming rules)
        return _last[1]
    model = flatbuffer.from_bytes(reference, "reference")
    depth = depths(model)  # (before the copies widen float16 weights in the same parse)
    made = _Copies(model)
    # the copies run in worker threads (two at a time), the first while the next one is made:
    # independent interpreters, each giving a lone run's outputs
    with ThreadPoolExecutor(2) as pool:
        pending = [
            pool.submit(_run_alone, made.perturbed(seed + 7919 * (c + 1)), inputs, delegate)
            for c in range(copies)
        ]
        runs = [p.result() for p in pending]
    noise = _noise(reference_outputs, runs)
    result = RoundOff()
    for k, name in enumerate(names):
        refs = [np.abs(r_set[k].astype(np.float64)) for r_set in reference_outputs]
        if not refs or reference_outputs[0][k].dtype.kind != "f":
            continue
        magnitude = np.max(np.where(np.isfinite(refs), refs, 0.0), axis=0)
        scale = float(magnitude.max()) if magnitude.size else 0.0
        n = noise[k] if k < len(noise) else np.zeros(magnitude.shape)
        top = float(n.max()) if n.size else 0.0
        d = max(depth.get(name, 1), 1)
        floor = FLOOR_FACTOR * U * d * magnitude + U * scale
        result.bounds[name] = K * np.maximum(n, ETA * top) + floor
        result.noise[name] = n
        result.summary[name] = {
            "output_scale": scale,
            "noise_max": top,
            "depth": d,
            "bound_max": float(result.bounds[name].max()) if n.size else 0.0,
        }
    _last[:] = [key, result]
    return result


_last: list[Any] = []  # the last estimate and its key
