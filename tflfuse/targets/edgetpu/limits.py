"""The compiler's row limit at a model's interface, named with its evidence (`check`, the report).

Every op the Edge TPU maps holds at most `max_row_elements` (176400) in the two innermost
dimensions of each tensor it reads or writes (delegates/edgetpu.toml, [meta] and the semantics
block: the compiler's own statuses on YOLOv8 heads accept [1, 84, 2100] and refuse 230400 and
up). A graph input or output over it cannot be rewritten into pieces: every op reading the input,
or writing the output, touches the whole tensor, so it stays on the CPU in every compile mode.
Two such limits come with the models Coral users bring, and each has one answer:

  * an image input laid out NCHW (PyTorch exports: litert-torch, Ultralytics 8.4's `tflite`):
    [1, 3, 640, 640] holds 409600 elements in its two innermost dimensions, where the same image
    NHWC ([1, 640, 640, 3]) holds 1920. `tflfuse convert --channels-last` gives the model that
    interface (an interface change the user opts into), which lifts the limit;
  * a detection head's output joined along its anchors ([1, 84|116|135, 2100|8400]): the join
    (and its requantization) stays on the CPU after the segment, one crossing. No mode maps it;
    the modes' table says which mode is best with it there.

No TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from tflfuse.ir import Model, Tensor
from tflfuse.targets.capabilities import capability


def _row_elements(t: Tensor) -> int:
    """Elements in the two innermost dimensions (the whole tensor below rank 2)."""
    return int(np.prod(t.shape[-2:], dtype=np.int64)) if t.shape else 1


def _nhwc_fits(t: Tensor, limit: int) -> tuple[int, ...] | None:
    """The NHWC shape of a 4-D input read as NCHW [N, C, H, W] with a few channels (an image),
    when that layout is within the row limit; None otherwise."""
    if len(t.shape) != 4 or t.shape[1] > 4 or min(t.shape[2:]) < 2:
        return None
    nhwc = (t.shape[0], t.shape[2], t.shape[3], t.shape[1])
    return nhwc if nhwc[2] * nhwc[3] <= limit else None


def interface_limit_notes(model: Model) -> list[str]:
    """One sentence per graph input or output over the row limit: the limit, its evidence, and
    what lifts it (--channels-last for an NCHW image input) or that nothing does (an output)."""
    limit = int(capability("edgetpu")["meta"]["max_row_elements"])
    graph = model.main
    evidence = (
        f"more than the {limit:,} any compiled model shows accepted (the compiler's own logs on"
        " YOLOv8 heads refuse 230,400 and up: delegates/edgetpu.toml)"
    )
    notes = []
    for t in graph.inputs:
        held = _row_elements(t)
        if held <= limit:
            continue
        nhwc = _nhwc_fits(t, limit)
        text = (
            f"input {t.name!r} {list(t.shape)} holds {held:,} elements in its two innermost"
            f" dimensions, {evidence}: every op reading it stays on the CPU in every mode"
        )
        if nhwc is not None:
            text += (
                f"; laid out NHWC ({list(nhwc)}: {nhwc[2] * nhwc[3]:,}) it is within the limit:"
                " for an NCHW export (litert-torch, PyTorch), `tflfuse convert --channels-last`"
                " gives the model that input (an interface change) and lifts the limit"
            )
        notes.append(text)
    for t in graph.outputs:
        held = _row_elements(t)
        if held <= limit or t.producer is None:
            continue
        notes.append(
            f"output {t.name!r} {list(t.shape)} holds {held:,} elements in its two innermost"
            f" dimensions, {evidence}: the op writing it ({t.producer.type}) stays on the CPU"
            " in every mode, after the segment (no rewrite changes an output's shape)"
        )
    return notes
