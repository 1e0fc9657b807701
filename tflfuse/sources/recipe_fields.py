"""What a source reads of the conversion's recipe: the sources sit below `convert` (they never
import it, tests/test_architecture.py), so they take the recipe by the fields they use.
`tflfuse.convert.recipe.Recipe` has them all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tflfuse.targets import Target


class RecipeFields(Protocol):
    """The recipe as a source sees it (read-only)."""

    @property
    def target(self) -> Target: ...  # the converter's settings for it (keras_route)

    @property
    def quant_mode(self) -> str: ...  # "int8", "dynamic", "float16" or "none"

    @property
    def input_type(self) -> str: ...  # float32, int8 or uint8 at the model's boundary

    @property
    def output_type(self) -> str: ...

    @property
    def grappler(self) -> tuple[str, ...]: ...  # the TF route's Grappler optimizers

    @property
    def select_tf_ops(self) -> bool: ...
