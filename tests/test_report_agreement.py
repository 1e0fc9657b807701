"""The report's agreement figures: the reference's half computed once for every model measured
against it (`ReferenceFacts`) gives the figures computed per model, bit for bit."""

from __future__ import annotations

import numpy as np

from tflfuse.convert.report import ReferenceFacts, agreement, centered_cosine


def test_shared_reference_facts_give_the_figures_computed_per_model() -> None:
    rng = np.random.default_rng(3)
    reference = [rng.normal(size=(6, 10)).astype(np.float32), rng.normal(size=(6, 3, 5))]
    known = [ReferenceFacts(r) for r in reference]
    inputs = [np.zeros((6, 2), np.float32)]
    for noise in (0.0, 0.01, 1.0):
        got = [(r + noise * rng.normal(size=r.shape)).astype(np.float64) for r in reference]
        alone = agreement(b"", inputs, reference, outputs=lambda got=got: got)
        shared = agreement(b"", inputs, reference, outputs=lambda got=got: got, known=known)
        assert shared == alone
        assert "top1_agreement" in alone["outputs"][0] and "cosine" in alone["outputs"][1]
        cand = got[1]
        ref64 = reference[1].astype(np.float64)
        assert known[1].cosine(cand) == centered_cosine(ref64, cand)
