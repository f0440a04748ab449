"""
CLAPP++: layer-local self-supervised learning, probed layer by layer
====================================================================

:class:`mlpapers.ssl.CLAPPEncoder <mlpapers.ssl.clapp.CLAPPEncoder>` trains every
block of a small convolutional
network with its own contrastive-predictive loss: block inputs are detached, so no
gradient crosses blocks. With direct feedback (``"clapp++dfb"``) each block
predicts the *top* block's representation of another view of the same image.

We train it without labels on shifted digits, then fit a logistic-regression probe
on each block's pooled features, and compare with the untrained (random-init)
encoder and with the end-to-end backprop baseline
(:class:`mlpapers.ssl.GlobalSSLEncoder <mlpapers.ssl.clapp.GlobalSSLEncoder>`, the same
hinge loss at the top only).
The right panel shows how well each block's local update aligns with the backprop
update (:func:`mlpapers.ssl.update_similarity <mlpapers.ssl.clapp.update_similarity>`).

This runs in seconds on a CPU, far from the paper's 300 epochs: at this budget
the local rules mostly reshape the first blocks (which learn *where* the ink is
and lose probe accuracy) and every trained encoder is still close to, or below,
the random one. The cosines of a few batches are noisy; the user guide's benchmark
table gives the multi-seed picture (where direct feedback aligns best).
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity

X, y = make_shifted_digits(n_samples=700, random_state=0)
Xtr, ytr, Xte, yte = X[:400], y[:400], X[400:], y[400:]
kw = dict(architecture="tiny", augment="light", n_epochs=8, random_state=0)

encoders = {
    "random init": CLAPPEncoder(**{**kw, "n_epochs": 0}).fit(Xtr),
    "CLAPP++DFB (local)": CLAPPEncoder(variant="clapp++dfb", **kw).fit(Xtr),
    "BP-CLAPP (global)": GlobalSSLEncoder(loss="clapp", **kw).fit(Xtr),
}


def probe(enc, layers):
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500, C=0.1))
    clf.fit(enc.transform(Xtr, layers=layers), ytr)
    return clf.score(enc.transform(Xte, layers=layers), yte)


n_blocks = 3
acc = {name: [probe(enc, layer) for layer in range(n_blocks)] + [probe(enc, "all")]
       for name, enc in encoders.items()}
for name, values in acc.items():
    print(f"{name:20s}", " ".join(f"{v:.3f}" for v in values))

# %%
# Alignment of the local updates with backprop, per block (the top block's local
# loss *is* the global loss, so its cosine is 1).
lateral = CLAPPEncoder(variant="clapp++", **kw).fit(Xtr)
sims = {
    "CLAPP++DFB": update_similarity(encoders["CLAPP++DFB (local)"], Xtr, n_batches=4,
                                    random_state=0),
    "CLAPP++ (lateral)": update_similarity(lateral, Xtr, n_batches=4, random_state=0),
}
print(sims)

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
labels = [f"block {i}" for i in range(n_blocks)] + ["all"]
width = 0.27
for k, (name, values) in enumerate(acc.items()):
    ax1.bar(np.arange(len(labels)) + (k - 1) * width, values, width, label=name)
ax1.set_xticks(np.arange(len(labels)), labels)
ax1.set_ylabel("linear probe accuracy")
ax1.set_ylim(0, 1)
ax1.legend(fontsize=8, loc="lower right")
for k, (name, sim) in enumerate(sims.items()):
    ax2.bar(np.arange(n_blocks) + (k - 0.5) * 0.4, [sim[i] for i in range(n_blocks)], 0.4,
            label=name)
ax2.set_xticks(np.arange(n_blocks), [f"block {i}" for i in range(n_blocks)])
ax2.set_ylabel("cos(local update, BP update)")
ax2.axhline(0, color="k", lw=0.5)
ax2.legend(fontsize=8)
fig.tight_layout()
