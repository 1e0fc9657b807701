"""The parameter memory of one compile mode: bytes cached on chip and streamed per inference.

Read from the memory predictor's numbers (`memory.predicted_memory`, which `predict_edgetpu`
puts in `Prediction.memory`), never re-derived: one segment and `-a` hold the mapped ops of one
Edge TPU, one cache between them; `-n N` compiles N pieces, each for an Edge TPU of its own with
its own cache, so each piece's numbers are its own prediction and the mode's are their sums.
Where the predictor leaves the layout undecided (`memory.undecided_counts`), the counts travel
with the bytes, so nothing here reads as more exact than the layout it comes from.

Also the short text of many segments' bytes (`segment_lines`): count, min / median / max,
which exceed a cache, which stream; the full list stays in the JSON. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tflfuse.json_types import JSONDict
from tflfuse.targets.edgetpu.memory import undecided_counts, undecided_line

LISTED = 4  # segment numbers named in a line before "..."


def mib(n: int) -> str:
    """Bytes for a reader: MiB from 1 MiB up, KiB from 1 KiB, else bytes."""
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"


@dataclass(frozen=True)
class ParameterMemory:
    """Parameter bytes in the compiler's layout, split between the on-chip cache and streaming
    (per inference, every inference), for one Edge TPU's segment or a whole mode; `undecided`:
    `predicted_memory`'s counts of what the evidence cannot decide (empty when exact)."""

    parameter_bytes: int = 0
    cached_bytes: int = 0
    streamed_bytes: int = 0
    cache_bytes: int = 0  # one Edge TPU's cache
    undecided: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, memory: dict[str, int]) -> ParameterMemory:
        """From a `Prediction.memory` (`predicted_memory`'s keys)."""
        return cls(
            int(memory.get("parameter_bytes", 0)),
            int(memory.get("on_chip_bytes", 0)),
            int(memory.get("off_chip_bytes", 0)),
            int(memory.get("cache_bytes", 0)),
            undecided_counts(memory),
        )

    @classmethod
    def summed(cls, parts: Sequence[ParameterMemory]) -> ParameterMemory:
        """Segments on Edge TPUs of their own (`-n N`): bytes and undecided counts added; the
        cache stays one Edge TPU's."""
        undecided: dict[str, int] = {}
        for p in parts:
            for key, n in p.undecided.items():
                undecided[key] = undecided.get(key, 0) + n
        return cls(
            sum(p.parameter_bytes for p in parts),
            sum(p.cached_bytes for p in parts),
            sum(p.streamed_bytes for p in parts),
            max((p.cache_bytes for p in parts), default=0),
            undecided,
        )

    @property
    def exceeds_cache(self) -> bool:
        """More parameter bytes than one Edge TPU caches."""
        return bool(self.cache_bytes) and self.parameter_bytes > self.cache_bytes

    def undecided_line(self) -> str | None:
        """`memory.undecided_line` of these counts (None when the layout is exact)."""
        return undecided_line(dict(self.undecided))

    def to_dict(self) -> JSONDict:
        return {
            "parameter_bytes": self.parameter_bytes,
            "cached_bytes": self.cached_bytes,
            "streamed_bytes": self.streamed_bytes,
            "cache_bytes": self.cache_bytes,
            "exceeds_cache": self.exceeds_cache,
            **({"undecided": dict(self.undecided)} if self.undecided else {}),
        }

    def line(self) -> str:
        """One Edge TPU's parameters in words: cached and streamed per inference."""
        if not self.parameter_bytes:
            return "no parameters on the Edge TPU"
        fits = "fit" if not self.exceeds_cache else "exceed"
        text = (
            f"parameters {mib(self.parameter_bytes)} ({fits} the {mib(self.cache_bytes)} cache):"
            f" {mib(self.cached_bytes)} cached, {mib(self.streamed_bytes)} streamed per inference"
        )
        return text + (" (layout undecided in part)" if self.undecided else "")


def _numbers(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:LISTED])
    return shown + (", ..." if len(indices) > LISTED else "")


def _median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) // 2


def segment_lines(parts: Sequence[ParameterMemory]) -> list[str]:
    """N segments' parameters in two lines of bounded length whatever N: the sums over their
    Edge TPUs, then min / median / max per segment and which exceed their cache or stream (at
    most `LISTED` named each)."""
    if not parts:
        return ["no segments"]
    total = ParameterMemory.summed(parts)
    undecided = sum(1 for p in parts if p.undecided)
    head = (
        f"parameters {mib(total.parameter_bytes)} over {len(parts)} Edge TPUs:"
        f" {mib(total.cached_bytes)} cached, {mib(total.streamed_bytes)} streamed per inference"
    )
    if undecided:
        head += f" (layout undecided in part in {undecided} of {len(parts)} segments)"
    sizes = [p.parameter_bytes for p in parts]
    over = [k for k, p in enumerate(parts) if p.exceeds_cache]
    streaming = [k for k, p in enumerate(parts) if p.streamed_bytes]
    text = f"per segment min {mib(min(sizes))}, median {mib(_median(sizes))}, max {mib(max(sizes))}"
    if over:
        text += f"; {len(over)} exceed the {mib(total.cache_bytes)} cache ({_numbers(over)})"
    else:
        text += "; every segment's parameters fit its cache"
    if streaming:
        text += f"; {len(streaming)} stream ({_numbers(streaming)})"
    return [head, text]
