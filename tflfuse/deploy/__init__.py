"""Device bundles from the host: `packing` writes a bundle (the models, the device modules of
`tflfuse.device`, bench_on_device.py and a manifest with each model's runtime verdicts), `deploy`
sends one over SSH, runs it and fetches the results. Above the device floor and the targets
(whose runtime table gives the verdicts); no TensorFlow.
"""

from __future__ import annotations
