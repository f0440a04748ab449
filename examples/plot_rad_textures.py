"""
RAD: training-free anomaly maps on textures
===========================================

:class:`~mlpapers.anomaly.rad.RADDetector` stores the patch features of normal
images and, for a test image, retrieves the most similar normal images and
scores every patch by its distance to the nearest patch at nearby positions in
them. There is no training. Here all four procedural textures of
:func:`~mlpapers.datasets.make_texture_anomalies` share one memory (the paper's
multi-class setting), and RAD is compared with the PatchCore baseline on the
same (torch-only, random-weight) feature extractor.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import roc_auc_score

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
from mlpapers.datasets import make_texture_anomalies

X_train, X_test, y_test, mask_test = make_texture_anomalies(
    n_train=32, n_test=32, image_size=48, random_state=0)

rad = RADDetector(extractor="random", k_images=10, image_size=None).fit(X_train)
maps, scores = rad.anomaly_map(X_test, return_scores=True)
patchcore = PatchCoreDetector(extractor="random", image_size=None, random_state=0)
pc_maps, pc_scores = patchcore.fit(X_train).anomaly_map(X_test, return_scores=True)

for name, m, s in [("RAD", maps, scores), ("PatchCore", pc_maps, pc_scores)]:
    print(f"{name:9s} image AUROC {roc_auc_score(y_test, s):.3f}  "
          f"pixel AUROC {roc_auc_score(mask_test.ravel(), m.ravel()):.3f}")

# %%
# Defective test images, their ground-truth masks and RAD's anomaly maps. The
# threshold ``threshold_`` comes from leave-one-out scores of the training
# images and ``contamination=0.1``.
show = np.flatnonzero(y_test)[:5]
fig, axes = plt.subplots(3, len(show), figsize=(2 * len(show), 6.2))
for col, i in enumerate(show):
    axes[0, col].imshow(X_test[i].transpose(1, 2, 0))
    axes[0, col].set_title(f"score {scores[i]:.2f}\n"
                           f"{'anomalous' if scores[i] > rad.threshold_ else 'normal'}")
    axes[1, col].imshow(mask_test[i], cmap="gray")
    axes[2, col].imshow(maps[i], cmap="inferno", vmin=0, vmax=maps.max())
for ax, label in zip(axes[:, 0], ["image", "mask", "RAD map"]):
    ax.set_ylabel(label)
for ax in axes.ravel():
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
