"""What `tflfuse convert` asks of a source: the one interface its stages read.

A source turns what the user gave into the float .tflite the rules start from, and answers the
questions the later stages ask: the interface (names, shapes, batch), whether it is int8 already,
how the unfused and stock baselines are made, and the function the three written models are
measured against. Two sources implement it:
  `tflfuse.sources.keras_route.KerasSource`  a Keras model, SavedModel or tf.function, through
                                            Grappler and the TFLite converter
  `tflfuse.sources.tflite.TfliteSource`      a .tflite from anywhere, entering at the float stage
Every member is stated by each source (no default the pipeline falls back on): a source without
a channels-last interface says `layout = None`, one without a TF graph `graph_info = {}`.
`tests/test_sources_protocol.py` checks both against this declaration, signatures included.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tflfuse.json_types import JSONDict
from tflfuse.sources.layout import LayoutChange
from tflfuse.sources.recipe_fields import RecipeFields


class Source(Protocol):
    """A model on its way into `tflfuse convert` (see the module docstring)."""

    kind: str  # "tensorflow" or "tflite": the report's source kind
    name: str  # how messages and the report name the model
    quantized: bool  # int8 already: convert legalizes it and does not re-quantize
    input_names: list[str]
    input_shapes: list[tuple[int, ...]]  # without the batch dimension
    output_names: list[str]
    batch: int
    notices: list[str]  # said once the conversion succeeded, and in the report
    # the interface convert gives the rules' models, when it differs from the source's
    # (--channels-last on an NCHW .tflite); None: the source's own interface
    layout: LayoutChange | None
    # Grappler's record of the TF graph (optimizers, node counts; {} without a TF graph), final
    # once float_tflite returned (an order-sensitive optimizer dropped is added there)
    graph_info: dict[str, Any]

    def tf_graph(self, rec: RecipeFields) -> None:
        """Grappler on the TF graph with the recipe's optimizers, recorded in `graph_info`
        (nothing without a TF graph)."""
        ...

    def float_tflite(self, rec: RecipeFields) -> bytes:
        """The float .tflite the rules start from (int8 for an int8 input)."""
        ...

    def unfused_float(
        self, rec: RecipeFields, fused_float: bytes, verify: bool = True
    ) -> tuple[bytes, str] | None:
        """The unfused float baseline and a sentence saying how it was made; None: the source
        has no unfused graph of its own and convert defuses the float model (a .tflite)."""
        ...

    def converter_ptq(
        self, which: str, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> bytes | None:
        """`which` ("fused" or "unfused") quantized by the converter's own PTQ, for a model
        litert-quantizer cannot make fully int8; None where there is no converter route."""
        ...

    def stock(
        self, rec: RecipeFields, calib: list[np.ndarray] | None, progress: bool
    ) -> tuple[bytes, str] | None:
        """What the user gets without tflfuse, and a sentence saying how it was made; None:
        convert makes it from the source's model (litert-quantizer on a .tflite)."""
        ...

    def eval_inputs(self, calib: list[np.ndarray] | None, seed: int) -> list[np.ndarray]:
        """The inputs the report measures the models on (the source's layout, whole batches)."""
        ...

    def reference(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The source's own outputs for `inputs`: what every written model is measured against."""
        ...

    def describe(self) -> JSONDict:
        """The report's `source_kind`: the kind, where it entered the pipeline, and more."""
        ...
