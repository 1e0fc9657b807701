"""The target-neutral rewrite rules, one module per kind (a rule is a `tflfuse.rewrite.Rule`):

  algebra     identities and cancellations (RemoveIdentityArithmetic, CancelTransposePair,
              CollapseReshapeChain, CancelQuantizeDequantize, FactorCommonMultiplier,
              SquareExistingDifference) and activations written out in element-wise ops
              recognized (RecognizeHardSwish, RecognizeLeakyRelu, RecognizeGelu)
  cleanup     FoldConstants (on the interpreter), MergeDuplicateConstants,
              EliminateCommonSubexpressions
  defuse      Defuse: fused activations and biases spelled out (the unfused baselines)
  epilogue    FoldBiasIntoProducer, FoldScaleIntoProducer, FuseActivationIntoProducer
  exporter    what exporters write in many ops (`exporter_rules(target)`): layer norms, clamps,
              pads, reshapes and layouts around them, constant BATCH_MATMULs
  horizontal  sibling ops merged (MergeSiblingSum, MergeSiblingOps, HoistLayoutAboveSplit)
  kernels     operand forms the CPU kernels run faster (MeanKeepDims, MeanLastAxisAsRows,
              SpellOutInt8HardSwish)
  runtime     what an older interpreter release cannot build (`RULES`, `--runtime`)
  vertical    chains folded into one op (FoldPadIntoConv, MoveScaleThroughRelu,
              MoveScaleThroughMean, FoldAffineIntoFollowing, FoldBiasThroughAdd,
              MergeLinearChain, FoldScaleIntoMatmulOperand, DropReshapeBeforeFullyConnected)

The Edge TPU's legalization rules are its own (`tflfuse.targets.edgetpu.rules`), int8 completion
is the quantizer's (`tflfuse.quantize.int8_completion`). Which rules run, in which order, for a
level and a target is `tflfuse.convert.rule_sets`. Keep this file empty of imports: importing one
rule module runs it.
"""

from __future__ import annotations
