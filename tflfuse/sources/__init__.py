"""Where models come from: Keras / SavedModel / .h5 (`keras`, its safety check `safety`, the
TensorFlow route `keras_route`) and any .tflite (`tflite`, with the channels-last
interface `layout`), each a `protocol.Source` for `tflfuse convert`. Only `keras*` import
TensorFlow, lazily.
"""

from __future__ import annotations
