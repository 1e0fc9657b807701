"""The whole-graph passes every pipeline ends with: dead-code elimination, topological sort."""

from __future__ import annotations

from tflfuse.ir import Graph
from tflfuse.rewrite.rule import Pass

# Ops whose effect is more than their outputs: dead-code elimination keeps them.
SIDE_EFFECTS = frozenset(
    {
        "ASSIGN_VARIABLE",
        "VAR_HANDLE",
        "CALL_ONCE",
        "WHILE",
        "IF",
        "CALL",
        "CUSTOM",
        "HASHTABLE",
        "HASHTABLE_IMPORT",
        "HASHTABLE_FIND",
        "HASHTABLE_SIZE",
        "STABLEHLO_CUSTOM_CALL",
    }
)


# -- the passes every pipeline ends with -------------------------------------------------------
class DeadCodeElimination(Pass):
    """Remove ops nobody reads (unless they have side effects) and tensors nobody references."""

    def run(self, graph: Graph) -> int:
        removed = 0
        outputs = set(graph.outputs)
        changed = True
        while changed:
            changed = False
            for op in reversed(list(graph.ops)):
                if op.type in SIDE_EFFECTS or op.extra.get("mutating_variable_inputs"):
                    continue
                if any(t.is_variable for t in op.inputs if t is not None):
                    continue
                if any(t.consumers or t in outputs for t in op.outputs):
                    continue
                graph.remove_op(op)
                removed += 1
                changed = True
        referenced = set(graph.inputs) | outputs
        for op in graph.ops:
            referenced.update(
                t for t in (*op.inputs, *op.outputs, *op.intermediates) if t is not None
            )
        kept = [t for t in graph.tensors if t in referenced]
        removed += len(graph.tensors) - len(kept)
        graph.tensors = kept
        return removed


class TopologicalSort(Pass):
    """Re-order ops so producers come first (rewrites may append ops at the end)."""

    def run(self, graph: Graph) -> int:
        return int(graph.toposort())
