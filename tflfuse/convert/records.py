"""What each stage of `tflfuse convert` hands on: one typed record per stage.

  load       LoadRecord       the source (a `tflfuse.sources.protocol.Source`) and its
                              calibration data
  float      FloatRecord      the .tflite the rules start from, and Grappler's record
  fuse       OptimizeResult   the recipe's rules on it, verified (`tflfuse.convert.optimize`)
  unfused    UnfusedRecord    the unfused float baseline, how it was made and its check
  quantize   QuantizedRecord  fused and unfused quantized, with their routes
  legalize   LegalizeRecord   the int8 rules on the fused model: ran, kept, why not
  runtime    RuntimeRecord    --runtime: the release the fused model was made for
  baselines  BaselinesRecord  the three models as written, and the stock model's route
The pipeline (`tflfuse.convert.pipeline`) keeps them on its Context; the report
(`tflfuse.convert.report.assemble`) is assembled from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from tflfuse.json_types import JSONDict
from tflfuse.quantize.quantize import Quantized
from tflfuse.sources.layout import LayoutChange
from tflfuse.sources.protocol import Source


@dataclass(frozen=True)
class LoadRecord:
    """The source, and its calibration data in the source's own layout (None: none given and
    none needed)."""

    source: Source
    calib: list[np.ndarray] | None

    def interface(self, which: str) -> LayoutChange | None:
        """The layout change between the source and model `which` (None: the same interface;
        the stock model always keeps the source's)."""
        return None if which == "stock" else self.source.layout

    def inputs_for(self, which: str, arrays: list[np.ndarray] | None) -> list[np.ndarray] | None:
        """Arrays in the source's layout, laid out for model `which`."""
        change = self.interface(which)
        return arrays if arrays is None or change is None else change.adapt_inputs(arrays)


@dataclass(frozen=True)
class FloatRecord:
    """The model the rules start from (float; int8 for an int8 .tflite input) and Grappler's
    record of the TF graph before it ({} for a .tflite source)."""

    data: bytes
    grappler: dict[str, Any]


@dataclass(frozen=True)
class UnfusedRecord:
    """The unfused float baseline: the model, how it was made (`route`), and its check against
    the fused float model or, for a source that checked it itself, against the source's input
    (`{"verified": False, ...}` under --no-verify)."""

    data: bytes
    route: str
    check: dict[str, Any]


@dataclass
class QuantizedRecord:
    """Fused and unfused as quantized by the recipe's mode (as given for an int8 input).
    `fused.data` is the fused model later stages change in place when their rewrite is kept
    (legalize, runtime). `unfused` is None when litert-quantizer has no int8 config for some of
    its ops (`unfused_left`) and no converter route exists: the baselines stage makes it."""

    fused: Quantized
    unfused: Quantized | None
    rules_pending: bool = False  # the fused int8 model still needs the target's whole pipeline
    unfused_left: str = ""  # the ops that left `unfused` to the baselines stage


@dataclass(frozen=True)
class LegalizeRecord:
    """The int8 rules on the quantized fused model. `ran`: whether there were any for the recipe;
    `kept`: whether their verified result replaced the model; `reason`: why they did not run or
    were not kept; `details`: the rules, what fired, op counts and the verification."""

    ran: bool
    kept: bool = False
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def dropped(self) -> str | None:
        """Why a legalization that ran was not kept (None: it was, or it did not run)."""
        return self.reason if self.ran and not self.kept else None

    def to_dict(self) -> JSONDict:
        """The report's `legalization` section."""
        if not self.ran:
            return {"ran": False, "reason": self.reason}
        kept = {"kept": True} if self.kept else {"kept": False, "reason": self.reason}
        return {"ran": True, **self.details, **kept}


@dataclass(frozen=True)
class RuntimeRecord:
    """--runtime: the release the fused model was made for, whether it runs there, the
    verification of the runtime legalization and the runtime rules that fired (the report's
    `runtime` section, before each written model's own check is added)."""

    section: dict[str, Any]


@dataclass(frozen=True)
class BaselinesRecord:
    """The three models as written: the fused one, the unfused baseline (quantized, with its
    route) and the stock model with the sentence saying how it was made."""

    fused: bytes
    unfused: Quantized
    stock: bytes
    stock_route: str

    @property
    def models(self) -> dict[str, bytes]:
        """fused, unfused, stock: the models the report measures, in its order."""
        return {"fused": self.fused, "unfused": self.unfused.data, "stock": self.stock}


class _OutputAgreement(TypedDict):
    max_abs: float
    mean_abs: float
    reference_range: float
    varies: bool  # the reference output differs between the check inputs


class OutputAgreement(_OutputAgreement, total=False):
    """One output of a model against the source (`agreement`)."""

    cosine: float  # only where the output varies
    spread: float
    top1_agreement: float  # only for class scores
    reference_classes: int


class ModelAgreement(TypedDict, total=False):
    """A model against the source on the check inputs (`agreement`): `verified`, and either
    `samples`, `outputs` and the largest `max_abs`, or why not (`reason`; `runs` False when
    it fails in the interpreter)."""

    verified: bool  # (always there)
    runs: bool
    reason: str
    samples: int
    outputs: list[OutputAgreement]
    max_abs: float


class Report(TypedDict, total=False):
    """The report of one conversion (`tflfuse.convert.report.assemble`; report.json as written,
    and as `tflfuse.convert.compare` reads it back). The sections a reader looks into key by key
    stay open dicts; `runtime`, `edgetpu`, `timings_s` and `accuracy_loss_accepted` are there
    only for a conversion they apply to (--runtime, an Edge TPU recipe, a written report, a
    model kept with --accept-accuracy-loss)."""

    source: str
    source_kind: JSONDict
    recipe: dict[str, Any]
    versions: dict[str, str]
    inputs: list[JSONDict]
    outputs: list[str]
    interface: dict[str, Any]
    grappler: dict[str, Any]
    rules: dict[str, Any]
    unfused_route: str
    quantization: dict[str, Any]
    legalization: JSONDict
    models: dict[str, dict[str, Any]]
    float_models: dict[str, dict[str, Any]]
    agreement: dict[str, ModelAgreement]
    float_agreement: dict[str, ModelAgreement]
    baseline_check: dict[str, Any]
    class_score_outputs: list[str]
    warnings: list[str]
    delegate_check: JSONDict
    files: dict[str, str]
    notices: list[str]
    runtime: dict[str, Any]  # --runtime: the release it was made for, each model's check
    edgetpu: dict[str, Any]  # the Edge TPU's predicted mapping, stock against fused
    timings_s: dict[str, float]
    accuracy_loss_accepted: str
