"""RAD and the PatchCore baseline as PyOD-style image anomaly detectors.

:class:`PatchCoreDetector` is defined in ``_patchcore`` and re-exported here.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from einops import rearrange

from mlpapers._utils import (
    ArrayLike,
    ProgressLogger,
    RandomStateLike,
    check_in_options,
    check_positive,
    to_numpy,
)
from mlpapers.anomaly.rad._common import BaseImageDetector, check_fraction, check_image_size
from mlpapers.anomaly.rad._extractors import ExtractorFn
from mlpapers.anomaly.rad._kernels import (
    global_patch_similarity,
    l2_normalize,
    retrieve_neighbours,
)
from mlpapers.anomaly.rad._maps import fused_smoothed_maps, top_ratio_pool
from mlpapers.anomaly.rad._matching import order_by_neighbours, positional_similarity
from mlpapers.anomaly.rad._patchcore import PatchCoreDetector

__all__ = ["PatchCoreDetector", "RADDetector"]

_REF = ('X. Zhang, G. Li, P. Henderson, G. Aragon-Camarasa and Z. Long, "Is Task-Specific '
        'Training Necessary for Anomaly Detection?", ICML 2026, arXiv:2601.22763')


class RADDetector(BaseImageDetector):
    r"""Retrieval-based, training-free image anomaly detection (RAD).

    The memory holds the per-layer patch features and a global key of every
    normal training image (one memory for all categories). A test image
    retrieves its ``k_images`` nearest training images by key cosine; per layer,
    patch :math:`j` scores

    .. math:: s_l(j) = 1 - \max_{n \in R,\ m \in W_r(j)} \cos(q_{l,j}, P_{l,n,m}),

    with :math:`W_r(j)` the :math:`(2r+1)^2` grid window around :math:`j`
    (clipped at the borders; the whole grid when ``pos_radius=None``). Layer
    maps are upsampled to ``map_size`` (default: the network input size) and fused
    with ``layer_weights``, blurred with a Gaussian (5x5 for :math:`\sigma=1`), and
    the image score is the mean of the top ``top_ratio`` fraction of map pixels
    (at least one pixel).

    Parameters
    ----------
    extractor : None, {"random", "efficientnet-lite0"} or callable, default=None
        ``None`` is the ImageNet EfficientNet-Lite0 (blocks 4 and 10; needs the
        ``pretrained`` extra). ``"random"`` is the torch-only
        :class:`RandomConvExtractor`. A callable maps ``(B, 3, H, W)`` images in
        [0, 1] to ``(list of (B, C_l, h_l, w_l) maps, (B, D) keys)``, e.g.
        :class:`TorchFeatureExtractor` or :class:`DinoViTExtractor` (the
        paper's DINOv3 ViT-B/16 path). The module behind it (the extractor, or
        the owner of a bound method) runs in eval mode under inference mode on a
        copy of each batch and is left as given; see the user guide, "Your own
        backbone". Read again when scoring, as a pickled or loaded copy does: an
        extractor set after ``fit`` must give the fitted feature shapes
        (``feature_shapes_``, else ``ValueError``).
    k_images : int, default=150
        Number of retrieved training images, clamped to the memory size.
    pos_radius : int or None, default=1
        Half-size ``r`` of the positional window; ``0`` matches the same grid
        position only, ``None`` matches every position (no positional prior).
    layer_weights : array-like of shape (n_layers,) or None, default=None
        Non-negative fusion weights, normalised to sum to one; ``None`` is uniform.
    image_size : int, (int, int) or None, default=224
        Network input size, square or ``(height, width)`` (a tuple or a list of two
        ints); images are resized (bilinear, antialiased). ``None``
        keeps the input size (all images must then share it); otherwise a list
        of images of different sizes is accepted. Maps and image scores are
        computed at this size unless ``map_size`` is set; :meth:`anomaly_map`
        resizes to the input (one map per image, in a list, for images of
        different sizes).
    map_size : int, (int, int) or None, default=None
        Size at which the layer maps are fused, blurred and pooled into the image
        score; ``None`` is the network input size. The paper's DINO setting feeds
        448-pixel images and scores maps at 256 pixels: ``image_size=448,
        map_size=256``. Read when scoring, like ``top_ratio``.
    top_ratio : float in [0, 1], default=0.01
        Fraction of map pixels averaged into the image score; ``0`` is the max.
    smoothing_sigma : float, default=1.0
        Standard deviation (in pixels of the map) of the Gaussian blur of the
        fused map (kernel ``2 * ceil(2 * sigma) + 1``); ``0`` disables it.
    blur_padding : {"zeros", "reflect"}, default="zeros"
        ``"zeros"`` follows the official code (it darkens the map's border);
        ``"reflect"`` mirrors the map about its edges, as ``numpy.pad(mode="reflect")``.
    contamination : float in (0, 0.5], default=0.1
        Expected fraction of anomalies, sets ``threshold_`` (PyOD convention).
    memory_dtype : {"float32", "float16", "bfloat16"}, default="float32"
        Storage dtype of the patch memory (half precision halves its size, and the
        fit's peak with it: each batch of features is normalised and cast as it is
        extracted; similarities are always computed in float32).
    matching : {"auto", "shared", "tiled", "gather"}, default="auto"
        Kernel of the positional matching; all give the same scores (to float
        rounding). ``"shared"`` scores a batch of test images against the union
        of their retrieved images, one batched matmul per window row on a padded,
        position-major layout of the memory, with the exact multiply-add count
        and no gathered windows
        (``shared_patch_similarity()``);
        ``"tiled"`` scores 4x4 tiles of positions against the ``(4+2r)^2``
        candidate block of every retrieved image with dense matmuls
        (``tiled_patch_similarity()``);
        ``"gather"`` gathers each position's ``k * (2r+1)^2`` window candidates
        with padded neighbour indices and a mask
        (``positional_patch_similarity()``).
        ``"auto"`` picks ``"shared"`` or ``"tiled"`` per scoring batch by a cost
        rule (``choose_matching()``: shared
        unless the batch's retrieved sets are nearly disjoint). Test images are
        grouped by their nearest retrieved images before being cut into
        batches, so that a batch's union stays small; scores are returned in
        the input order.
    batch_size : int, default=16
        Images per extractor batch and per scoring batch.
    chunk_size : int, default=2**24
        Maximum number of values in one gathered candidate / similarity chunk
        (64 MB in float32); bounds the scoring memory. Test images are extracted and
        scored in groups of whole batches whose float32 features hold at most
        ``8 * chunk_size`` values, so the scoring memory is the output plus one group.
    device : str or torch.device, default="cpu"
        Where the extractor runs and the memory is stored and matched:
        ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"`` (CUDA when
        available). A custom extractor module whose weights are elsewhere runs on
        a copy made on this device (with a warning).
    random_state : int, RandomState, Generator or None, default=None
        Unused (RAD is deterministic; ``None`` draws no seed from numpy's global
        generator); kept for API consistency, and checked in ``fit`` as elsewhere.
    verbose : int, default=0
        Show a progress bar over batches.

    Attributes
    ----------
    memory_ : list of Tensor of shape (n_train, h_l * w_l, C_l)
        L2-normalised patch features per layer.
    keys_ : Tensor of shape (n_train, D)
        Retrieval keys.
    grid_shapes_ : list of (int, int)
        Feature grid per layer.
    layer_weights_ : ndarray of shape (n_layers,)
        Normalised fusion weights at fit time. Like ``k_images``, ``pos_radius``,
        ``top_ratio`` and the other scoring parameters, ``layer_weights`` is read
        again when scoring, so ``set_params`` after ``fit`` takes effect on new
        scores (``decision_scores_`` and ``threshold_`` keep their fit values).
    input_size_ : (int, int)
        Network input size the memory was built at.
    decision_scores_ : ndarray of shape (n_train,)
        Leave-one-out scores of the training images (each retrieves among the
        others; with a single training image, zeros, and ``predict`` warns).
    threshold_ : float
        ``(1 - contamination)`` quantile of ``decision_scores_``.
    labels_ : ndarray of shape (n_train,)
        ``decision_scores_ > threshold_``.
    n_features_in_ : int
        ``3 * H * W`` of the training images (grayscale counts as RGB; for a
        list of images of different sizes, ``H, W`` is ``image_size``).
    n_train_ : int
        Number of training images in the memory.
    feature_shapes_ : list of (int, int, int)
        ``(C, h, w)`` of each extractor feature map at fit time (checked when
        scoring: another extractor raises a ``ValueError``).

    See Also
    --------
    PatchCoreDetector : the coreset + nearest-neighbour baseline.

    Notes
    -----
    Scores of images that are in the memory are 0 (the image retrieves itself), as
    in the official code, up to float rounding of the cosine: about 1e-7 with the
    float32 memory, 1e-4 with ``memory_dtype="float16"`` and 1e-3 with
    ``"bfloat16"``. ``decision_scores_`` therefore uses leave-one-out retrieval so
    that ``threshold_`` is meaningful. A patch whose feature vector is exactly zero
    (e.g. ReLU features of a uniform region: a uniform mid-gray image with
    :class:`RandomConvExtractor`) has cosine 0 with every patch, itself included, and
    scores 1, as in the official code.

    References
    ----------
    .. [1] X. Zhang, G. Li, P. Henderson, G. Aragon-Camarasa and Z. Long, "Is
       Task-Specific Training Necessary for Anomaly Detection?", ICML 2026,
       arXiv:2601.22763.

    Examples
    --------
    >>> from mlpapers.anomaly.rad import RADDetector
    >>> from mlpapers.datasets import make_texture_anomalies
    >>> X_train, X_test, y_test, masks = make_texture_anomalies(
    ...     n_train=8, n_test=6, image_size=32, random_state=0)
    >>> det = RADDetector(extractor="random", k_images=4, image_size=None).fit(X_train)
    >>> det.decision_function(X_test).shape, det.anomaly_map(X_test).shape
    ((6,), (6, 32, 32))
    >>> bool(abs(det.decision_function(X_train[:1])[0]) < 1e-5)
    True
    """

    _uses_random_state = False  # RAD draws no random numbers

    def __init__(self, *,
                 extractor: Literal["random", "efficientnet-lite0"] | ExtractorFn | None = None,
                 k_images: int = 150, pos_radius: int | None = 1,
                 layer_weights: ArrayLike | None = None,
                 image_size: int | tuple[int, int] | list[int] | None = 224,
                 map_size: int | tuple[int, int] | list[int] | None = None,
                 top_ratio: float = 0.01, smoothing_sigma: float = 1.0,
                 blur_padding: Literal["zeros", "reflect"] = "zeros",
                 contamination: float = 0.1,
                 memory_dtype: Literal["float32", "float16", "bfloat16"] = "float32",
                 matching: Literal["auto", "shared", "tiled", "gather"] = "auto",
                 batch_size: int = 16, chunk_size: int = 2**24,
                 device: str | torch.device = "cpu", random_state: RandomStateLike = None,
                 verbose: int = 0) -> None:
        self.extractor = extractor
        self.k_images = k_images
        self.pos_radius = pos_radius
        self.layer_weights = layer_weights
        self.image_size = image_size
        self.map_size = map_size
        self.top_ratio = top_ratio
        self.smoothing_sigma = smoothing_sigma
        self.blur_padding = blur_padding
        self.contamination = contamination
        self.memory_dtype = memory_dtype
        self.matching = matching
        self.batch_size = batch_size
        self.chunk_size = chunk_size
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> None:
        self._check_common_params()
        check_in_options(self.matching, "matching", ("auto", "shared", "tiled", "gather"))
        check_positive(self.k_images, "k_images", integer=True)
        check_image_size(self.map_size, "map_size")
        if self.pos_radius is not None:
            check_positive(self.pos_radius, "pos_radius", integer=True, strict=False)
        check_fraction(self.top_ratio, "top_ratio", 1.0, zero_allowed=True)
        check_in_options(self.blur_padding, "blur_padding", ("zeros", "reflect"))
        if self.layer_weights is not None:
            message = ("layer_weights must be a 1D array of non-negative numbers with a "
                       f"positive sum, got {self.layer_weights!r}.")
            try:
                w = np.asarray(to_numpy(self.layer_weights), dtype=float)
            except (TypeError, ValueError):  # strings, ragged lists
                raise ValueError(message) from None
            # (w.max(), not w.sum(): a sum of weights near 1e308 overflowed, with a warning)
            if (w.ndim != 1 or not w.size or not np.all(np.isfinite(w)) or np.any(w < 0)
                    or not w.max() > 0):
                raise ValueError(message)

    # -- memory ---------------------------------------------------------------
    @staticmethod
    def _patches(feats: list[torch.Tensor]) -> list[torch.Tensor]:
        return [l2_normalize(rearrange(f, "n c h w -> n (h w) c")) for f in feats]

    def _resolve_layer_weights(self, n_layers: int) -> np.ndarray:
        if self.layer_weights is None:
            return np.full(n_layers, 1.0 / n_layers)
        w = np.asarray(to_numpy(self.layer_weights), dtype=float)
        if len(w) != n_layers:
            raise ValueError(f"layer_weights has {len(w)} entries but the extractor "
                             f"returns {n_layers} layers.")
        w = w / w.max()  # (weights near 1e308 summed to inf: every weight became 0)
        return w / w.sum()

    def _fit_store(self):
        """Normalise and cast each fit batch as it is extracted: the fit then holds the
        memory in ``memory_dtype`` plus one float32 batch, never the float32 features of
        all training images (the values equal a float32 fit cast afterwards)."""
        dtype = self._memory_dtype()

        def store(feats):
            self.grid_shapes_ = [(int(f.shape[2]), int(f.shape[3])) for f in feats]
            return [p.to(dtype) for p in self._patches(feats)]
        return store

    def _fit_memory(self, feats, keys) -> torch.Tensor:
        """``feats``: the normalised patches (n, L_l, C_l) in the memory dtype (from
        :meth:`_fit_store`)."""
        self.layer_weights_ = self._resolve_layer_weights(len(feats))
        self.memory_ = [p.contiguous() for p in feats]
        self.keys_ = keys.float().contiguous()
        n = len(keys)
        if n < 2:  # float32 as the scores of a larger memory, whatever the default dtype
            return torch.zeros(n, dtype=torch.float32)
        exclude = torch.arange(n, device=keys.device)
        return self._score_all(self.memory_, keys, exclude=exclude, return_maps=False)[1]

    # -- scoring ----------------------------------------------------------------
    def _score_patches(self, patches, nbrs, return_maps=True):
        """Maps and scores of one batch of images with retrieved ``nbrs`` (b, k)."""
        dev = self._resolved_device
        layer_maps, layer_weights = [], []
        # read at scoring time, like the other scoring parameters (set_params after fit)
        weights = self._resolve_layer_weights(len(self.memory_))
        for q, mem, (h, w), wl in zip(patches, self.memory_, self.grid_shapes_, weights):
            if wl == 0:
                continue
            q, mem = q.to(dev).float(), mem.to(dev)
            if self.pos_radius is None:
                sim = global_patch_similarity(q, mem, nbrs, self.chunk_size)
            else:
                sim = positional_similarity(q, mem, nbrs, (h, w), self.pos_radius,
                                            self.matching, self.chunk_size)
            layer_maps.append((1.0 - sim).clamp_min(0.0).reshape(len(nbrs), h, w))
            layer_weights.append(float(wl))
        # upsampling, fusion and blur in one pass (two small matmuls per batch); read
        # at scoring time, like the other scoring parameters (set_params after fit)
        size = check_image_size(self.map_size, "map_size") or self.input_size_
        maps = fused_smoothed_maps(layer_maps, layer_weights, (size[0], size[1]),
                                   float(self.smoothing_sigma), self.blur_padding)
        scores = top_ratio_pool(maps, float(self.top_ratio))
        return (maps if return_maps else None), scores

    def _score_all(self, patches, keys, exclude=None, return_maps=True, verbose=None):
        """Retrieve, group images by retrieved sets, score in batches, restore the order
        (``verbose`` overrides the estimator's for the progress bar)."""
        dev = self._resolved_device
        n, bs = len(keys), self.batch_size
        mem_keys = self.keys_.to(dev)
        nbrs = torch.cat([retrieve_neighbours(
            keys[i:i + bs].to(dev), mem_keys, self.k_images,
            exclude=None if exclude is None else exclude[i:i + bs].to(dev))
            for i in range(0, n, bs)])
        order = order_by_neighbours(nbrs)  # exact: every image is scored on its own
        maps = scores = None
        # the matching dominates at scale (e.g. the leave-one-out scores of a large memory)
        what = "leave-one-out scores" if exclude is not None else "matching"
        for b in ProgressLogger(-(-n // bs),
                                verbose=self.verbose if verbose is None else verbose,
                                desc=f"{type(self).__name__} {what}"):
            idx = order[b * bs:(b + 1) * bs]
            m, s = self._score_patches([p[idx.to(p.device)] for p in patches], nbrs[idx],
                                       return_maps)
            # written in place at the images' input positions: no list of the batches'
            # maps (which would pin the heap between the matching's large transient
            # blocks, see mlpapers._utils._blocks) and no reordered copy of them
            if scores is None:
                scores = s.new_empty(n)
                maps = None if m is None else m.new_empty((n, *m.shape[1:]))
            scores[idx.to(s.device)] = s
            if maps is not None:
                maps[idx.to(m.device)] = m
            del m, s
        return maps, scores

    def _score_store(self):
        """Normalise each batch of test features as it is extracted (float32): the
        scoring then never holds the raw features next to their normalised copy."""
        return self._patches

    def _score_extracted(self, feats, keys, return_maps, verbose=None):
        return self._score_all(feats, keys, return_maps=return_maps, verbose=verbose)

    @property
    def memory_bytes_(self) -> int:
        """Bytes held by the patch memory and keys."""
        self._check_fitted()
        return int(sum(m.numel() * m.element_size() for m in self.memory_)
                   + self.keys_.numel() * self.keys_.element_size())
