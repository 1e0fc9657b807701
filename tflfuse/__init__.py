"""tflfuse: fused, quantized, target-aware TensorFlow Lite models for edge devices.

The Python API is four functions at the package top (documented in `tflfuse.api` and README):

    tflfuse.convert(model, output_dir, recipe="xnnpack-int8", calibration=...) -> ConversionResult
    tflfuse.optimize(model, output=None, target="xnnpack", level=2)           -> OptimizeResult
    tflfuse.check(model, target="edgetpu")                                    -> Prediction
    tflfuse.bench([model_a, model_b], runs=100)                               -> dict

`import tflfuse` stays light (no numpy, no TensorFlow): the names resolve on first use. One of
them is also a subpackage (`tflfuse.convert`, the conversion pipeline), and Python sets a package
attribute to its subpackage once that is imported; so that package is made callable instead
(calling it calls the API function). The parts and their layering: docs/ARCHITECTURE.md.
This file is shipped in device bundles: Python 3.7 syntax, stdlib.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from tflfuse.version import __version__

API = ("convert", "optimize", "check", "bench")
SUBPACKAGES = ("convert",)  # API names that are also subpackages
__all__ = ["__version__", *API]


def _api_function(name: str) -> Any:
    from tflfuse import api

    return getattr(api, name)


class _CallableModule(types.ModuleType):
    """A tflfuse subpackage whose name is also an API function: calling it calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _api_function(self.__name__.rpartition(".")[2])(*args, **kwargs)

    @property
    def __signature__(self) -> Any:  # what inspect.signature / help show for the call
        import inspect

        return inspect.signature(_api_function(self.__name__.rpartition(".")[2]))


class _Package(types.ModuleType):
    """This package: an API subpackage becomes callable as the import system binds it here."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in API and type(value) is types.ModuleType:
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    if name in SUBPACKAGES:  # the (callable) subpackage
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name in API:
        return _api_function(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
