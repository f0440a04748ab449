"""CLI demo: ``python -m mlpapers demo rad [--quick]``."""

from __future__ import annotations

import time

from sklearn.metrics import roc_auc_score

from mlpapers._registry import DemoResult, register


def _run(det, X_train, X_test, y, mask):
    start = time.perf_counter()
    det.fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    elapsed = time.perf_counter() - start
    return (roc_auc_score(y, scores), roc_auc_score(mask.ravel(), maps.ravel()), elapsed)


@register("rad", module="mlpapers.anomaly.rad", estimator="RADDetector",
          paper="Is Task-Specific Training Necessary for Anomaly Detection?",
          arxiv="2601.22763")
def demo(quick: bool) -> list[DemoResult]:
    """RAD vs PatchCore on procedural textures, all four textures in one memory.

    Uses the torch-only random-conv extractor, so it runs without the
    ``pretrained`` extra.
    """
    from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
    from mlpapers.datasets import make_texture_anomalies

    n, size = (16, 32) if quick else (40, 48)
    data = make_texture_anomalies(n, n, image_size=size, random_state=0)
    rad = RADDetector(extractor="random", k_images=10, image_size=None)
    pc = PatchCoreDetector(extractor="random", coreset_ratio=0.1, image_size=None,
                           random_state=0)
    r_img, r_pix, r_t = _run(rad, *data)
    p_img, p_pix, p_t = _run(pc, *data)
    return [
        DemoResult("RAD", "PatchCore", "image AUROC", r_img, p_img, r_t, p_t),
        DemoResult("RAD", "PatchCore", "pixel AUROC", r_pix, p_pix, r_t, p_t),
    ]
