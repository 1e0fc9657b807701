"""tflfuse: fused, quantized, target-aware TensorFlow Lite models for edge devices."""

__version__ = "0.1.0"
