"""The targets tflfuse builds models for: one `Target` per accelerator or runtime, in one place.

A target is everything the rest of tflfuse asks by name: what the user calls it (`name`, the
CLI's `--target` choices), what it is called in sentences (`label`), its capability table
(`delegates/NAME.toml`), its predictor (where each op runs), how its rule pipeline differs
(`convert.rule_sets.pipeline` reads `legalization`, `recognizes_activations`, `kernel_rewrites`,
`batch_matmul_as_fully_connected`; FuseActivationIntoProducer `fused_activation_limit`), its cost
profile (the budgets `targets.cost` answers from), the recipes made for it (`converters/`), and
whether an ahead-of-time compiler decides its mapping (the Edge TPU's `edgetpu_compiler`: the
options and the report section that only make sense for one).

This module stays light (no numpy, no model code at import): the command line reads its names
to build `--target` choices without loading any machinery. The predictors and the legalization
rules are imported when first asked for.

Adding a target: a `Target` in `_TARGETS` below, its table in `delegates/`, its predictor in
`targets/` (a subfolder when it has more than one module, like `edgetpu/`), a recipe in
`converters/`; `tests/test_targets_registry.py` checks the pieces agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tflfuse.errors import TflfuseError

if TYPE_CHECKING:  # types only: importing them loads numpy and the model code
    from tflfuse.ir import Model, Op
    from tflfuse.rewrite import Pass, Refusal, Rule
    from tflfuse.targets.capabilities import CapabilityTable, Prediction

MIB = 1 << 20


@dataclass(frozen=True)
class CostProfile:
    """The budgets rules ask before a rewrite that is not a win everywhere (`targets.cost`)."""

    # Bytes of weights the target keeps close to the compute units (a merged weight must fit).
    on_chip_bytes: int = 2 * MIB
    # Its delegate runs SPLIT_V (unequal parts) inside the same partition. XNNPACK delegates
    # SPLIT (equal parts) but not SPLIT_V (tensorflow/lite/delegates/xnnpack/xnnpack_delegate.cc
    # visits kTfLiteBuiltinSplit only, and XNNPACK's even split defines 2, 3 or 4 outputs).
    split_v_delegated: bool = True
    # Most parts one SPLIT may have (None: any).
    split_max_parts: int | None = None
    # It computes in int8 only, one scale per activation tensor: a merged op writes one tensor,
    # so its siblings' outputs would share one scale (MediaPipe's hand landmark heads, ranges
    # 220 and 0.2: the narrow output lost all its precision).
    int8_only: bool = False
    # Most dimensions larger than 1 it maps in one tensor (None: any).
    max_nontrivial_dims: int | None = None
    # The runtime of delegates/cost_table.json its models run on (None: no measured table).
    runtime: str | None = None


Predictor = Callable[["Model", "str | None", bool], "Prediction"]


@dataclass(frozen=True)
class Target:
    """One accelerator or runtime, and every fact about it that tflfuse branches on."""

    name: str  # what the user types: --target NAME, Recipe.target
    label: str  # how sentences name it: "Edge TPU"
    table: str | None  # its capability table, delegates/TABLE.toml (None: none)
    predictor: Predictor | None  # where each op runs (None: `tflfuse check` cannot say)
    cost: CostProfile
    recipes: tuple[str, ...] = ()  # converters/NAME.toml made for it
    # The ahead-of-time compiler that decides the mapping (None: the delegate decides at run
    # time). A compiled target gets --compiler-version, --multiple-subgraphs, --twin, `tflfuse
    # compile`, mapped-op counts in the int8 legalization and a mapping section in the report.
    compiler: str | None = None
    on_cpu: bool = False  # its models run on the host CPU's TFLite kernels (TF ops could, too)
    # -- how its rule pipeline differs (tflfuse.convert.rule_sets.pipeline) --
    # Its legalization rules (Rule and Pass instances), run first at level 2 and alone on the
    # quantized model. A function: the rules load on first use (device scripts load none).
    legalization: Callable[[], tuple[Rule | Pass, ...]] | None = None
    # Recognize spelled-out activations as builtins (HARD_SWISH, LEAKY_RELU, GELU): not for a
    # target whose compiler does not map them.
    recognizes_activations: bool = True
    # The rewrites that pay on CPU/GPU kernels (scale into a matmul operand, MEAN keep_dims, ...),
    # not for a target whose compiler makes its own mapping-driven choices.
    kernel_rewrites: bool = True
    # A constant-weight BATCH_MATMUL becomes FULLY_CONNECTED (BatchMatmulToFullyConnected) where
    # that was measured to pay (benchmarks/exporter_rules_bench.py): the same speed on float
    # XNNPACK, 13x faster int8 (XNNPACK takes no int8 BATCH_MATMUL) and on the plain kernels,
    # and an Edge TPU legalization. False where it was not measured (the GPU).
    batch_matmul_as_fully_connected: bool = True
    # Why fusing an activation into an op would cost the target that op (None: it may). A
    # function of (op type, activation) returning a `tflfuse.rewrite.Refusal` or None (this
    # module imports no rewrite code: the device scripts load it), loaded on first use; the
    # Edge TPU's reads its table's `fused_activations` rows (delegates/edgetpu.toml): a pool
    # maps only with NONE, so MAX_POOL_2D + RELU stays two mapped ops rather than one fused
    # pool the compiler leaves on the CPU. FuseActivationIntoProducer and the int8 completion
    # ask it (`fused_activation_refusal`).
    fused_activation_limit: Callable[[str, str], Refusal | None] | None = None
    # Whether a chain of layout ops (RESHAPE, TRANSPOSE, SLICE...) stays as written rather than
    # shortened by CanonicalizeLayoutChain, loaded on first use: the Edge TPU keeps a chain whose
    # every op compiled models show mapped at its size, so the shortening cannot undo the layout
    # cuts (targets/edgetpu/layout.py), which would cut the shortened op again, and so on.
    layout_chain_kept: Callable[[Sequence[Op]], bool] | None = None

    def predict(
        self, model: Model, compiler_version: str | None = None, multiple_subgraphs: bool = False
    ) -> Prediction:
        """Where each op of the main subgraph runs (use `tflfuse.targets.predict`, which also
        notes stored float16 weights)."""
        if self.predictor is None:
            raise TflfuseError(
                f"unknown target {self.name!r} (choose from {', '.join(names(predicts=True))})"
            )
        return self.predictor(model, compiler_version, multiple_subgraphs)

    def capabilities(self) -> CapabilityTable:
        """Its parsed capability table (`delegates/TABLE.toml`)."""
        from tflfuse.targets.capabilities import capability

        if self.table is None:
            raise TflfuseError(f"no capability table for target {self.name!r}")
        return capability(self.table)

    def legalization_rules(self) -> tuple[Rule | Pass, ...]:
        """Its legalization rules (empty for a target that needs none)."""
        return self.legalization() if self.legalization is not None else ()

    def fused_activation_refusal(self, op_type: str, activation: str) -> Refusal | None:
        """Why an `op_type` op with fused `activation` would not map on it (a `Refusal`), or
        None."""
        limit = self.fused_activation_limit
        return limit(op_type, activation) if limit is not None else None


# -- the predictors and rules, imported on first use (this module stays light) -------------------
def _predict_edgetpu(
    model: Model, compiler_version: str | None, multiple_subgraphs: bool
) -> Prediction:
    from tflfuse.targets.edgetpu.predict import predict_edgetpu

    return predict_edgetpu(model, compiler_version, multiple_subgraphs=multiple_subgraphs)


def _predict_xnnpack(model: Model, compiler_version: str | None, multiple: bool) -> Prediction:
    from tflfuse.targets.capabilities import predict_xnnpack

    return predict_xnnpack(model)


def _predict_gpu(model: Model, compiler_version: str | None, multiple: bool) -> Prediction:
    from tflfuse.ir import flatbuffer
    from tflfuse.targets.probe import predict_gpu

    # TFLite's analyzer reads bytes; it needs the interpreter package
    return predict_gpu(model, flatbuffer.to_bytes(model))


def _edgetpu_fused_activation_limit(op_type: str, activation: str) -> Refusal | None:
    from tflfuse.targets.edgetpu.rules import fused_activation_refusal

    return fused_activation_refusal(op_type, activation)


def _edgetpu_layout_chain_kept(chain: Sequence[Op]) -> bool:
    from tflfuse.targets.edgetpu.layout import every_op_shown_mapped

    return every_op_shown_mapped(chain)


def _edgetpu_legalization() -> tuple[Rule | Pass, ...]:
    from tflfuse.targets.edgetpu.attention import ATTENTION_LEGALIZATION
    from tflfuse.targets.edgetpu.broadcast import BROADCAST_LEGALIZATION
    from tflfuse.targets.edgetpu.clstoken import CLASS_TOKEN_LEGALIZATION
    from tflfuse.targets.edgetpu.heads import HEAD_LEGALIZATION
    from tflfuse.targets.edgetpu.l2norm import L2_NORM_LEGALIZATION
    from tflfuse.targets.edgetpu.layout import LAYOUT_LEGALIZATION
    from tflfuse.targets.edgetpu.nhwc import NHWC_LEGALIZATION
    from tflfuse.targets.edgetpu.patchbranches import PATCH_BRANCH_LEGALIZATION
    from tflfuse.targets.edgetpu.patches import PATCH_LEGALIZATION
    from tflfuse.targets.edgetpu.renorm import RENORM_LEGALIZATION
    from tflfuse.targets.edgetpu.rowmean import ROW_MEAN_LEGALIZATION
    from tflfuse.targets.edgetpu.rules import EDGETPU_LEGALIZATION

    # the heads first: a head cut along its anchors takes its oversized transposes with it,
    # which SplitOversizedTranspose would otherwise split and join again; the broadcasts last,
    # so that they also take the squeeze-excite-shaped MULs the attention products write; the
    # layout cuts after them all, on the reshapes and transposes they write too; before the heads,
    # an NCHW island back in its NHWC layout (PadChannelsForMean would pad its MEAN otherwise)
    # the patch unfolds and folds before the attention's head splits and the layout cuts: the
    # chain is taken whole, with the layout ops around it, before those cut its pieces
    legalizations = (
        *EDGETPU_LEGALIZATION,
        *L2_NORM_LEGALIZATION,
        *CLASS_TOKEN_LEGALIZATION,
        *PATCH_BRANCH_LEGALIZATION,
        *PATCH_LEGALIZATION,
        *ATTENTION_LEGALIZATION,
        *BROADCAST_LEGALIZATION,
    )
    # a normalization normalized twice before its means are replicated (it reads them as MEANs)
    first = (*NHWC_LEGALIZATION, *RENORM_LEGALIZATION, *ROW_MEAN_LEGALIZATION)
    return (*first, *HEAD_LEGALIZATION, *legalizations, *LAYOUT_LEGALIZATION)


# -- the registry -------------------------------------------------------------------------------
# In the order the command line lists them.
_TARGETS: tuple[Target, ...] = (
    Target(
        name="edgetpu",
        label="Edge TPU",
        table="edgetpu",
        predictor=_predict_edgetpu,
        # 8 MiB of on-chip SRAM shared by all parameters (edgetpu_compiler's "on-chip memory");
        # the compiler maps tensors with at most 3 non-trivial dimensions (delegates/edgetpu.toml)
        cost=CostProfile(on_chip_bytes=8 * MIB, int8_only=True, max_nontrivial_dims=3),
        recipes=("edgetpu",),
        compiler="edgetpu_compiler",
        legalization=_edgetpu_legalization,
        recognizes_activations=False,  # it maps none of HARD_SWISH, LEAKY_RELU, GELU
        kernel_rewrites=False,  # its pipeline keeps its own mapping-driven choices
        fused_activation_limit=_edgetpu_fused_activation_limit,
        layout_chain_kept=_edgetpu_layout_chain_kept,
    ),
    Target(
        name="xnnpack",
        label="XNNPACK",
        table="xnnpack",
        predictor=_predict_xnnpack,
        # a typical Arm/x86 L2 for one GEMM's packed weights. XNNPACK delegates SPLIT (equal
        # parts, 2 to 4 outputs) but not SPLIT_V: an unequal split would cut the partition
        # (tensorflow/lite/delegates/xnnpack/xnnpack_delegate.cc visits kTfLiteBuiltinSplit only)
        cost=CostProfile(
            on_chip_bytes=2 * MIB, split_v_delegated=False, split_max_parts=4, runtime="xnnpack"
        ),
        recipes=("xnnpack-int8", "cpu-float"),  # the CPU runtime applies XNNPACK by default
        on_cpu=True,
    ),
    Target(
        name="gpu",
        label="GPU",
        table=None,  # TFLite's GPU compatibility analyzer answers (targets.probe)
        predictor=_predict_gpu,
        cost=CostProfile(on_chip_bytes=4 * MIB),  # mobile GPUs: keep one layer's weights modest
        recipes=("gpu-fp16",),
        batch_matmul_as_fully_connected=False,  # not measured on a GPU
    ),
    Target(
        name="cpu",
        label="CPU",
        table=None,
        predictor=None,  # every op runs on them
        cost=CostProfile(on_chip_bytes=2 * MIB, runtime="none"),  # the plain built-in kernels
        on_cpu=True,
    ),
)
_BY_NAME: dict[str, Target] = {t.name: t for t in _TARGETS}
TARGETS: tuple[str, ...] = tuple(_BY_NAME)  # every target's name


def find(name: object) -> Target | None:
    """The target called `name`, or None (for any value, a list or None included)."""
    return _BY_NAME.get(name) if isinstance(name, str) else None


def target(name: str) -> Target:
    """The target called `name` (a TflfuseError naming the choices when there is none)."""
    found = find(name)
    if found is None:
        raise TflfuseError(f"unknown target {name!r} (choose from {', '.join(TARGETS)})")
    return found


def names(*, predicts: bool = False, compiled: bool = False) -> tuple[str, ...]:
    """The targets' names in the registry's order; `predicts`: only those `tflfuse check` can
    predict; `compiled`: only those an ahead-of-time compiler maps."""
    return tuple(
        t.name
        for t in _TARGETS
        if (not predicts or t.predictor is not None) and (not compiled or t.compiler is not None)
    )


def every() -> tuple[Target, ...]:
    """Every target, in the registry's order."""
    return _TARGETS


# The target a rule or a recipe serves when none is given (the CPU runtime applies XNNPACK by
# default), and the one the quantized legalization (`convert.rule_sets.legalize_quantized`) is for.
XNNPACK: Target = _BY_NAME["xnnpack"]
EDGETPU: Target = _BY_NAME["edgetpu"]
