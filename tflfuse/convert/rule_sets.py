"""Which rules run, in which order, for an optimization level and a target: the rule sets of
`tflfuse optimize` and of `tflfuse convert`'s rule stages (the rules themselves are in
`tflfuse.rules`, one module per kind, and the Edge TPU's legalization in its target).

A pipeline is a tuple read top to bottom; `pipeline(level, target)` returns the one to run.
Level 1 is epilogue fusion and cleanup only (what the stock converter would have done, on any
.tflite); level 2 adds vertical, horizontal and algebraic rewrites. Targets differ where a
rewrite pays on one runtime and not another:
  edgetpu  legalization first; no builtins the compiler does not map (HARD_SWISH, LEAKY_RELU,
           GELU stay spelled out in supported ops); horizontal merges within its 8 MiB of SRAM
  xnnpack  everything; horizontal merges avoid SPLIT_V (not delegated); int8 HARD_SWISH is
           spelled out in ops XNNPACK takes
  gpu, cpu everything; cpu (the plain built-in kernels) also picks their fast int8 MEAN
           paths and avoids their slow int8 SUB
Where a rule's payoff differs by runtime it asks the measured table (delegates/cost_table.json,
written by benchmarks/cost_table.py) through tflfuse.targets.cost.
"""

from __future__ import annotations

from collections.abc import Sequence

from tflfuse.ir import Model
from tflfuse.rewrite import (
    DeadCodeElimination,
    Pass,
    PassManager,
    PassResult,
    Rule,
    TopologicalSort,
)
from tflfuse.rules.algebra import (
    CancelQuantizeDequantize,
    CancelTransposePair,
    CollapseReshapeChain,
    FactorCommonMultiplier,
    RecognizeGelu,
    RecognizeHardSwish,
    RecognizeLeakyRelu,
    RemoveIdentityArithmetic,
    SquareExistingDifference,
)
from tflfuse.rules.cleanup import (
    EliminateCommonSubexpressions,
    FoldConstants,
    MergeDuplicateConstants,
)
from tflfuse.rules.epilogue import (
    FoldBiasIntoProducer,
    FoldScaleIntoProducer,
    FuseActivationIntoProducer,
)
from tflfuse.rules.exporter import exporter_rules
from tflfuse.rules.horizontal import HoistLayoutAboveSplit, MergeSiblingOps, MergeSiblingSum
from tflfuse.rules.kernels import MeanKeepDims, MeanLastAxisAsRows, SpellOutInt8HardSwish
from tflfuse.rules.runtime import RULES as RUNTIME_RULES
from tflfuse.rules.vertical import (
    DropReshapeBeforeFullyConnected,
    FoldAffineIntoFollowing,
    FoldBiasThroughAdd,
    FoldPadIntoConv,
    FoldScaleIntoMatmulOperand,
    MergeLinearChain,
    MoveScaleThroughMean,
    MoveScaleThroughRelu,
)
from tflfuse.targets import EDGETPU, XNNPACK, Target, every


def pipeline(
    level: int,
    target: Target = XNNPACK,
    *,
    quantized: bool = False,
    before_int8: bool = False,
    int8_completes: bool = False,
) -> tuple[Rule | Pass, ...]:
    """The rules and passes for an optimization level (0: none) and target (where its pipeline
    differs, its `Target` says).

    `quantized=True` is the stage after quantization: only the target's legalization of the int8
    model (Edge TPU: the rules' int8 forms, e.g. `SplitOversizedTranspose`), nothing for other
    targets. `before_int8=True` is the float stage of a model quantized to int8 next: the
    legalizations whose float form loses the signal in int8 (`Rule.float_form_loses_int8`,
    e.g. GELU's x^3) are left to their int8 forms, run after quantizing. `int8_completes`
    (with `before_int8`; the recipe's [legalization] attention_sum_after_int8): the rules whose
    float form waits for an int8 rule (`Rule.float_form_waits_for_int8`) write that form.
    """
    if level <= 0:
        return ()
    legalize = target.legalization_rules()
    if before_int8 and not quantized:
        legalize = tuple(r for r in legalize if not getattr(r, "float_form_loses_int8", False))
        if int8_completes:
            legalize = tuple(
                r.waiting_for_int8() if isinstance(r, Rule) and r.float_form_waits_for_int8 else r
                for r in legalize
            )
    if quantized:
        return (*legalize, DeadCodeElimination(), TopologicalSort()) if legalize else ()
    cleanup = _cleanup()
    epilogue: tuple[Rule | Pass, ...] = (
        FoldBiasIntoProducer(),
        FoldScaleIntoProducer(),
        FuseActivationIntoProducer(target),
    )
    if level == 1:
        return (*epilogue, *cleanup)
    return _level2(target, legalize, epilogue, cleanup)


def _cleanup() -> tuple[Rule | Pass, ...]:
    """What every level ends with: fold and share constants, drop dead ops, restore the order."""
    return (
        FoldConstants(),
        MergeDuplicateConstants(),
        EliminateCommonSubexpressions(),
        DeadCodeElimination(),
        TopologicalSort(),
    )


def _level2(
    target: Target,
    legalize: tuple[Rule | Pass, ...],
    epilogue: tuple[Rule | Pass, ...],
    cleanup: tuple[Rule | Pass, ...],
) -> tuple[Rule | Pass, ...]:
    """Level 2: the target's legalization and its exporter rules first, then algebra, activation
    recognition, the epilogue, vertical fusion (then the CPU kernels' two operand rewrites),
    horizontal fusion, the CPU kernels' own rewrites, and the cleanup."""
    algebra: tuple[Rule | Pass, ...] = (
        RemoveIdentityArithmetic(),
        CancelTransposePair(),
        CollapseReshapeChain(),
        CancelQuantizeDequantize(),
        FactorCommonMultiplier(target),
    )
    activations: tuple[Rule | Pass, ...] = (
        (RecognizeHardSwish(), RecognizeLeakyRelu(), RecognizeGelu())
        if target.recognizes_activations
        else ()
    )
    vertical: tuple[Rule | Pass, ...] = (
        FoldPadIntoConv(),
        MoveScaleThroughRelu(),
        MoveScaleThroughMean(),
        FoldAffineIntoFollowing(),
        FoldBiasThroughAdd(),
        MergeLinearChain(),
    )
    horizontal: tuple[Rule | Pass, ...] = (
        MergeSiblingSum(),
        MergeSiblingOps(target),
        HoistLayoutAboveSplit(target),
    )
    # Not for a target whose compiler keeps its own mapping-driven choices (the Edge TPU: its
    # `kernel_rewrites` is False). The first two come before the horizontal merges, which would
    # hide the Q projection in a SPLIT.
    cpu = target.kernel_rewrites
    cpu_vertical: tuple[Rule | Pass, ...] = (
        (FoldScaleIntoMatmulOperand(), DropReshapeBeforeFullyConnected()) if cpu else ()
    )
    cpu_kernels: tuple[Rule | Pass, ...] = (
        (
            SquareExistingDifference(),
            MeanKeepDims(target),
            MeanLastAxisAsRows(target),
            SpellOutInt8HardSwish(target),
        )
        if cpu
        else ()
    )
    exporter = exporter_rules(target)
    return (
        *legalize,
        *exporter,
        *algebra,
        *activations,
        *epilogue,
        *vertical,
        *cpu_vertical,
        *horizontal,
        *cpu_kernels,
        *cleanup,
    )


def all_rule_names() -> list[str]:
    """Every rule and pass any pipeline uses (the names `--disable` accepts), the runtime
    legalization's (`--runtime`, tflfuse.rules.runtime) included."""
    return sorted(
        {p.name for target in every() for level in (1, 2) for p in pipeline(level, target)}
        | {rule.__name__ for rule in RUNTIME_RULES}
    )


def legalize_quantized(model: Model, disabled: Sequence[str] = ()) -> PassResult:
    """Legalize an int8/uint8 model for the Edge TPU in place; what `convert` runs on the
    quantized fused model (the int8 forms of the rules only act here).

    The same passes as `tflfuse.convert.rule_sets.pipeline(2, EDGETPU, quantized=True)`.
    """
    return PassManager(pipeline(2, EDGETPU, quantized=True), disabled=disabled).run(model)
