"""
Shifted digits: an offline image dataset
========================================

:func:`mlpapers.datasets.make_shifted_digits` pastes scikit-learn's bundled 8x8
digits at random positions on a larger noisy canvas. It needs no download and
gives small images with translation variability, which the self-supervised and
anomaly-detection examples use.
"""

import matplotlib.pyplot as plt
import numpy as np

from mlpapers.datasets import make_shifted_digits

X, y = make_shifted_digits(n_samples=16, canvas=16, noise=0.1, random_state=0)
print(X.shape, X.dtype, f"pixel range [{X.min():.1f}, {X.max():.1f}]")

fig, axes = plt.subplots(2, 8, figsize=(8, 2.4))
for ax, img, label in zip(axes.ravel(), X[:, 0], y):
    ax.imshow(img, cmap="gray_r", vmin=0, vmax=1)
    ax.set_title(str(label))
    ax.axis("off")
fig.tight_layout()

# %%
# The digit's centre of mass moves across the canvas:
Xc, _ = make_shifted_digits(n_samples=500, canvas=16, noise=0.0, random_state=0)
mass = Xc[:, 0].sum(axis=(1, 2))
rows = (Xc[:, 0].sum(axis=2) * np.arange(16)).sum(axis=1) / mass
print(f"row centre of mass: mean {rows.mean():.2f}, std {rows.std():.2f}")
