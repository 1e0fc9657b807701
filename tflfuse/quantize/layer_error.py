"""Per-tensor error of an int8 model against its float model (the report's worst tensors), as
litert-quantizer's validator computes it, with each model's interpreter built once.

`Quantizer.validate` (`model_validator.compare_model`) builds two fresh interpreters that keep
every tensor (`preserve_all_tensors`) for every sample: on a 640-px YOLO26n each allocation of
its hundreds of full-size tensors took seconds, 8 of them for the report's 4 samples, and each
pair stays alive until the next is made (measured: benchmarks/CONVERT_BUDGET.md). Here each
model gets one such interpreter, invoked once per sample: the same inputs through the same
kernels give the same tensors (the models hold no variables; a model that does is compared by
the validator itself), compared by the validator's own functions and averaged over the samples
as it does, so the numbers are the validator's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tflfuse.ir import Model

if TYPE_CHECKING:  # the quantizer's type (it ships no annotations: read as Any)
    from litert_quantizer.utils import validation_utils

# Bytes of float activations up to which the table is computed. Its two interpreters keep every
# tensor of the float and the int8 model: measured on YOLO26n at 640 px, 1.2 GB peak for the
# whole conversion with 305 MiB of activations, 7.4 GB in this table alone once the attention
# products were spelled out (781 MiB): over the 2 GiB a conversion may take (issue 25). Above
# it the report says so.
BUDGET = 512 << 20


def _tensors(model: bytes, samples: list[dict[str, np.ndarray]], key: str | None):
    """Yield, per sample, (interpreter, subgraph index, name -> details) after invoking it."""
    from litert_quantizer.utils import tfl_interpreter_utils as utils

    interp = utils.create_tfl_interpreter(
        tflite_model=model, use_xnnpack=True, num_threads=1, preserve_all_tensors=True
    )
    subgraph = utils.get_signature_main_subgraph_index(interp, key)
    details = utils.get_tensor_name_to_details_map(interp, subgraph)
    for sample in samples:
        utils.invoke_interpreter_signature(interp, sample, key)
        yield interp, subgraph, details


def compare(
    float_model: bytes,
    quantized: bytes,
    key: str | None,
    samples: list[dict[str, np.ndarray]],
    metrics: list[validation_utils.ValidationErrorMetric],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(output tensors, intermediate tensors): name -> {metric: mean over the samples}, as the
    validator's `output_tensors` and `intermediate_tensors` (inputs and constants left out)."""
    from litert_quantizer.utils import tfl_interpreter_utils as utils
    from litert_quantizer.utils import validation_utils

    fns = [validation_utils.get_validation_func(m) for m in metrics]
    values: dict[str, list[list[float]]] = {}
    runs = zip(_tensors(float_model, samples, key), _tensors(quantized, samples, key))
    for (ref, ref_sub, ref_details), (tgt, tgt_sub, tgt_details) in runs:
        for name, detail in ref_details.items():
            if detail["dtype"] == np.object_ or not np.all(detail["shape"]):
                continue
            if name not in tgt_details:
                continue
            a = utils.get_tensor_data(ref, detail, ref_sub)
            b = utils.get_tensor_data(tgt, tgt_details[name], tgt_sub)
            per = values.setdefault(name, [[] for _ in fns])
            for k, fn in enumerate(fns):
                per[k].append(fn(b, a))
    result = {
        name: {m.value: float(np.mean(v)) for m, v in zip(metrics, per)}
        for name, per in values.items()
    }
    outputs = {n: result.pop(n) for n in utils.get_output_tensor_names(float_model, key)}
    for name in utils.get_input_tensor_names(float_model, key):
        result.pop(name, None)
    sub = utils.get_signature_main_subgraph_index(utils.create_tfl_interpreter(float_model), key)
    for name in utils.get_constant_tensor_names(float_model, sub):
        result.pop(name, None)
    return outputs, result


def stateful(model: Model) -> bool:
    """Whether the model holds variables (a reused interpreter would carry their state)."""
    return any(t.is_variable for g in model.subgraphs for t in g.tensors)


def activation_bytes(model: Model) -> int:
    """Bytes of the main graph's computed tensors (what an interpreter keeping every tensor
    holds of the float model)."""
    return sum(t.nbytes for t in model.main.tensors if not t.is_constant)


def skipped(held: int) -> str:
    """The report's sentence for a table not computed."""
    return (
        f"not computed: the float model's activations hold {held / 2**20:.0f} MiB, more than the"
        f" {BUDGET >> 20} MiB the comparison may keep (it holds every tensor of both models)"
    )
