"""Outputs of a model on given inputs, remembered, so one conversion runs each model once.

A conversion checks models in pairs and then measures them: the fused float model is the
candidate of one check (against the input) and the reference of the next (against the unfused
baseline), on the same seeded inputs; a .tflite whose rules changed nothing is the reference
the report measures against and its fused float model, on the same samples, and it is
calibrated for the fused model and again as the stock baseline's input. The interpreter is
deterministic (the same model bytes, inputs, kernels and thread count give the same outputs, and
every run starts from a fresh interpreter, so a stateful model sees the same sequence), so such a
repeat is answered from here (calibration statistics too: litert-quantizer's calibrator runs
the interpreter). The key is what decides the outputs: a digest of the model bytes, of every
input array (dtype, shape and bytes), the kind of run and its settings. The most recent
results are kept, up to `BUDGET` bytes of arrays; the arrays handed out are the stored ones,
which callers only read. Threads may ask at once (the report runs its models two at a time): a
key another thread is computing is waited for, not computed twice.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
BUDGET = 256 << 20  # bytes of stored arrays

_store: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
_lock = threading.Lock()  # guards _store, _running and hits (never held while computing)
_running: dict[tuple, threading.Event] = {}  # keys a thread is computing now
hits = 0  # how many answers came from here (tests, benchmarks)


def digest(model: bytes, arrays: Iterable[np.ndarray] = ()) -> str:
    """sha256 of the model bytes and of each array's dtype, shape and contents."""
    h = hashlib.sha256(model)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(_raw(a))
    return h.hexdigest()


def _raw(a: np.ndarray) -> memoryview | bytes:
    """The bytes of contiguous `a` as `a.tobytes()` gives them, without copying them (the
    report hashes 16 input samples per model run: 78 MB at 640 px); a 0-d or empty array, or one
    of a dtype the buffer protocol does not take, as its copy."""
    try:
        return a.data.cast("B") if a.ndim and a.size else a.tobytes()
    except (TypeError, ValueError):
        return a.tobytes()


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def remembered(kind: str, key: tuple, compute: Callable[[], T]) -> T:
    """`compute()`'s result for (kind, *key): computed once, then remembered while it is among
    the most recent results that fit in BUDGET."""
    global hits
    full = (kind, *key)
    while True:
        with _lock:
            if full in _store:
                _store.move_to_end(full)
                hits += 1
                return _store[full][0]
            busy = _running.get(full)
            if busy is None:
                done = _running[full] = threading.Event()
                break
        busy.wait()  # then answered from the store (or, when it failed or was too big, run here)
    try:
        value = compute()
        size = _nbytes(value)
        with _lock:
            if size <= BUDGET:
                _store[full] = (value, size)
                while sum(n for _, n in _store.values()) > BUDGET:
                    _store.popitem(last=False)
    finally:
        with _lock:
            del _running[full]
        done.set()
    return value


def clear() -> None:
    global hits
    with _lock:
        _store.clear()
        hits = 0
