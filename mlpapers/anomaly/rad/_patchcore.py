"""PatchCore, RAD's in-library baseline, as a PyOD-style image anomaly detector."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange

from mlpapers._utils import RandomStateLike
from mlpapers.anomaly.rad._common import BaseImageDetector, check_fraction
from mlpapers.anomaly.rad._extractors import ExtractorFn
from mlpapers.anomaly.rad._kernels import greedy_coreset, knn_distances
from mlpapers.anomaly.rad._maps import fused_smoothed_maps

__all__ = ["PatchCoreDetector"]


class PatchCoreDetector(BaseImageDetector):
    """PatchCore: a coreset of locally aggregated patch features and 1-NN distances.

    The in-library baseline of RAD, on the same extractors. Each layer's map is
    averaged over 3x3 neighbourhoods, resized to the first layer's grid and the
    layers are concatenated. The memory bank holds the patches of all training
    images, subsampled by greedy k-center selection (in a 128-d random
    projection) to ``coreset_ratio`` of its size. A test patch scores its
    Euclidean distance to the nearest memory patch; the image score is the
    maximum patch score, and the map is upsampled and Gaussian-blurred.

    Parameters
    ----------
    extractor : None, {"random", "efficientnet-lite0"} or callable, default=None
        As in :class:`RADDetector`.
    coreset_ratio : float in (0, 1], default=0.1
        Fraction of training patches kept (``1`` keeps all).
    image_size : int, (int, int) or None, default=224
        Network input size, as in :class:`RADDetector` (``None`` keeps the input
        size; otherwise images are resized, and lists of images of different
        sizes are accepted).
    smoothing_sigma : float, default=4.0
        Blur of the anomaly map (PatchCore's sigma, in pixels of the network
        input; ``0`` disables it); does not affect image scores.
    contamination : float in (0, 0.5], default=0.1
        Expected fraction of anomalies, sets ``threshold_`` (PyOD convention).
    memory_dtype : {"float32", "float16", "bfloat16"}, default="float32"
        Storage dtype of the memory bank (distances are computed in float32; a
        ``ValueError`` if the features overflow float16).
    batch_size : int, default=16
        Images per extractor batch.
    chunk_size : int, default=2**24
        Maximum (query, memory) pairs per distance chunk. Test images are extracted
        and scored in groups of whole batches whose float32 embeddings (counted four
        times: upsampled, concatenated and rearranged copies) hold at most
        ``8 * chunk_size`` values, so the scoring memory is the output plus one group.
    device : str or torch.device, default="cpu"
        Where the extractor runs and the memory bank is stored and searched, as
        in :class:`RADDetector`.
    random_state : int, RandomState, Generator or None, default=None
        Seeds the coreset start and projection.
    verbose : int, default=0
        Show progress bars over the extraction batches and the coreset selection.

    Attributes
    ----------
    memory_ : Tensor of shape (n_memory, C)
        The coreset of locally aggregated patch features, in ``memory_dtype``.
    memory_image_ids_ : Tensor of shape (n_memory,)
        Training image of each memory patch.
    grid_shape_ : (int, int)
        Patch grid ``(h, w)`` of the first feature layer (the map resolution).
    input_size_ : (int, int)
        Network input size the memory was built at.
    decision_scores_, threshold_, labels_ : as in :class:`RADDetector`
        Training scores are leave-one-out: each image is scored against the
        memory without its own patches, plus, in place of those, the other images'
        patches they covered in the coreset selection (which a coreset selected
        without the image would have had to cover; exact with
        ``coreset_ratio=1``).
    feature_shapes_ : list of (int, int, int)
        ``(C, h, w)`` of each extractor feature map at fit time (checked when
        scoring: another extractor raises a ``ValueError``).
    n_features_in_ : int
        ``3 * H * W`` of the training images, as in :class:`RADDetector`.
    n_train_ : int
        Number of training images.

    References
    ----------
    .. [1] K. Roth, L. Pemula, J. Zepeda, B. Schoelkopf, T. Brox and P. Gehler,
       "Towards Total Recall in Industrial Anomaly Detection", CVPR 2022.
    .. [2] X. Zhang, G. Li, P. Henderson, G. Aragon-Camarasa and Z. Long, "Is
       Task-Specific Training Necessary for Anomaly Detection?", ICML 2026,
       arXiv:2601.22763.

    Examples
    --------
    >>> from mlpapers.anomaly.rad import PatchCoreDetector
    >>> from mlpapers.datasets import make_texture_anomalies
    >>> X_train, X_test, y_test, _ = make_texture_anomalies(
    ...     n_train=8, n_test=6, image_size=32, random_state=0)
    >>> det = PatchCoreDetector(extractor="random", image_size=None, random_state=0)
    >>> det.fit(X_train).decision_function(X_test).shape
    (6,)
    """

    def __init__(self, *,
                 extractor: Literal["random", "efficientnet-lite0"] | ExtractorFn | None = None,
                 coreset_ratio: float = 0.1,
                 image_size: int | tuple[int, int] | list[int] | None = 224,
                 smoothing_sigma: float = 4.0, contamination: float = 0.1,
                 memory_dtype: Literal["float32", "float16", "bfloat16"] = "float32",
                 batch_size: int = 16, chunk_size: int = 2**24,
                 device: str | torch.device = "cpu", random_state: RandomStateLike = None,
                 verbose: int = 0) -> None:
        self.extractor = extractor
        self.coreset_ratio = coreset_ratio
        self.image_size = image_size
        self.smoothing_sigma = smoothing_sigma
        self.contamination = contamination
        self.memory_dtype = memory_dtype
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> None:
        self._check_common_params()
        check_fraction(self.coreset_ratio, "coreset_ratio", 1.0, zero_allowed=False)

    def _embed(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """(n, L, sum C_l) locally aggregated, concatenated patch features."""
        h, w = feats[0].shape[-2:]
        out = []
        for f in feats:
            f = F.avg_pool2d(f, 3, stride=1, padding=1, count_include_pad=False)
            if tuple(f.shape[-2:]) != (h, w):
                f = F.interpolate(f, size=(h, w), mode="bilinear", align_corners=False)
            out.append(f)
        emb = rearrange(torch.cat(out, dim=1), "n c h w -> n (h w) c")
        # squared distances of float32 features beyond this magnitude overflow to inf
        limit = math.sqrt(torch.finfo(torch.float32).max / (4 * emb.shape[-1]))
        top = float(emb.abs().amax()) if emb.numel() else 0.0
        if top > limit:
            raise ValueError(f"the extractor's features reach magnitude {top:.4g}, beyond "
                             f"{limit:.3g} where PatchCore's float32 squared distances "
                             "overflow; rescale the extractor's outputs (e.g. divide them "
                             "by a constant: the nearest neighbours do not change).")
        return emb

    def _score_values_per_image(self, shapes) -> int:
        """The embedding (every layer pooled and upsampled to the first layer's grid,
        concatenated and rearranged: about four copies of ``h_0 w_0 sum C_l`` values)
        is what an image holds while it is scored, several times its feature maps."""
        h, w = shapes[0][1], shapes[0][2]
        return 4 * int(h) * int(w) * sum(int(sh[0]) for sh in shapes)

    def _fit_memory(self, feats, keys) -> torch.Tensor:
        dev = self._resolved_device
        emb = self._embed(feats).to(dev)
        n, L, C = emb.shape
        # below this magnitude the squared distances between training features (and to
        # the memory later) fall under float32's normal range before their rounding
        # does: they came out coarsely rounded, or all 0 (every score equal)
        floor = math.sqrt(torch.finfo(torch.float32).tiny / torch.finfo(torch.float32).eps)
        top = float(emb.abs().amax()) if emb.numel() else 0.0
        if 0.0 < top < floor:
            raise ValueError(f"the extractor's features reach magnitude {top:.4g} only, below "
                             f"{floor:.3g} where PatchCore's float32 squared distances "
                             "underflow; rescale the extractor's outputs (e.g. multiply "
                             "them by a constant: the nearest neighbours do not change).")
        self.grid_shape_ = (int(feats[0].shape[2]), int(feats[0].shape[3]))
        flat = emb.reshape(n * L, C)
        ids = torch.arange(n, device=dev).repeat_interleave(L)
        cover = None  # for each patch, the memory patch that covers it (coreset only)
        if self.coreset_ratio < 1.0:
            n_keep = max(1, math.ceil(self.coreset_ratio * n * L))
            sel, cover = greedy_coreset(flat, n_keep, generator=self._torch_gen,
                                        verbose=self.verbose, return_assignment=True)
            flat_mem, ids_mem = flat[sel], ids[sel]
        else:
            flat_mem, ids_mem = flat, ids
        memory = flat_mem.to(self._memory_dtype()).contiguous()
        if not bool(torch.isfinite(memory).all()):  # float16 overflows at 65504
            raise ValueError(f"the patch features overflow memory_dtype={self.memory_dtype!r} "
                             f"(largest magnitude {float(flat_mem.abs().max()):.4g}); use "
                             "memory_dtype='float32' or rescale the extractor's features.")
        self.memory_ = memory
        self.memory_image_ids_ = ids_mem.contiguous()
        if n < 2:  # float32 as the scores of a larger memory, whatever the default dtype
            return torch.zeros(n, dtype=torch.float32)
        d = knn_distances(flat, self.memory_, k=1, chunk_size=self.chunk_size,
                          exclude_query_group=ids, memory_group=self.memory_image_ids_)[:, 0]
        if cover is not None:
            d = self._with_stand_ins(d, flat, ids, ids_mem[cover], n, L)
        # (every distance is finite: an image holding the whole memory has every other
        # image's patches as stand-ins)
        return d.reshape(n, L).amax(dim=1)

    def _with_stand_ins(self, d, flat, ids, owner, n, L) -> torch.Tensor:
        """Leave-one-out distances ``d`` (to the memory without the image's own patches)
        lowered to the patches of other images that the image's own memory patches
        covered in the coreset selection (``owner``: image of each patch's covering
        memory patch). Without the image the coreset would have kept patches there;
        with the bare memory a duplicated image (whose twin's patches the coreset never
        needed) scored as if it had none (threshold_ 3.7 vs 0.42 refitted)."""
        moved = torch.nonzero(owner != ids).squeeze(1)  # covered by another image
        by_owner = moved[torch.argsort(owner[moved], stable=True)]
        counts = torch.bincount(owner[moved], minlength=n).tolist()
        start = 0
        # one small search per image (its L patches against its stand-ins, about L
        # rows): n L^2 pairs in all, where one masked search would cost (n L)^2
        for i, count in enumerate(counts):
            if count:
                rows = by_owner[start:start + count]
                near = knn_distances(flat[i * L:(i + 1) * L],
                                     flat[rows].to(self.memory_.dtype), k=1,
                                     chunk_size=self.chunk_size)[:, 0]
                d[i * L:(i + 1) * L] = torch.minimum(d[i * L:(i + 1) * L], near)
            start += count
        return d

    def _score_features(self, feats, keys, exclude=None, return_maps=True):
        dev = self._resolved_device
        emb = self._embed(feats).to(dev)
        n, L, C = emb.shape
        h, w = self.grid_shape_
        mem = self.memory_.to(dev)
        d = knn_distances(emb.reshape(n * L, C), mem, k=1, chunk_size=self.chunk_size)
        d = d[:, 0].reshape(n, h, w)
        scores = d.reshape(n, -1).amax(dim=1)
        if not return_maps:
            return None, scores
        maps = fused_smoothed_maps([d], [1.0], (self.input_size_[0], self.input_size_[1]),
                                   float(self.smoothing_sigma))
        return maps, scores

    @property
    def memory_bytes_(self) -> int:
        """Bytes held by the memory bank."""
        self._check_fitted()
        return int(self.memory_.numel() * self.memory_.element_size())
