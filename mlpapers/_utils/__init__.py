"""Shared helpers used by every algorithm: validation, conversion, seeding, progress."""

from mlpapers._utils._ambient import (
    autograd_enabled,
    default_dtype,
    on_cpu_default_device,
    on_inputs_device,
    seed_from_generator,
    seeded_global_rng,
    usable_outside_inference,
    with_autograd,
    wrap_public_methods,
)
from mlpapers._utils._init import default_init_, seeded_linear
from mlpapers._utils._labels import encode_labels
from mlpapers._utils._progress import ProgressLogger
from mlpapers._utils._random import (
    check_generator,
    check_random_state,
    check_seed,
    make_generators,
)
from mlpapers._utils._typing import ArrayLike, RandomStateLike
from mlpapers._utils._units import power_of_two_unit, row_power_of_two
from mlpapers._utils._validation import (
    check_bool,
    check_finite,
    check_in_options,
    check_learning_rate,
    check_positive,
    check_real,
    check_tensor,
    check_verbose,
    common_float_dtype,
    holds_only_zero_one,
    probe_module,
    reject_flat_image_table,
    reject_single_hwc_image,
    requires_tensors,
    resolve_device,
    resolve_dtype,
    to_numpy,
    torch_compatible_array,
)
from mlpapers._utils._warnings import user_stacklevel

__all__ = [
    "ArrayLike",
    "RandomStateLike",
    "autograd_enabled",
    "default_dtype",
    "default_init_",
    "encode_labels",
    "on_cpu_default_device",
    "on_inputs_device",
    "seed_from_generator",
    "seeded_global_rng",
    "usable_outside_inference",
    "with_autograd",
    "wrap_public_methods",
    "ProgressLogger",
    "check_bool",
    "check_generator",
    "check_finite",
    "check_in_options",
    "check_learning_rate",
    "check_positive",
    "check_real",
    "check_random_state",
    "check_seed",
    "check_tensor",
    "check_verbose",
    "common_float_dtype",
    "holds_only_zero_one",
    "make_generators",
    "power_of_two_unit",
    "row_power_of_two",
    "probe_module",
    "reject_flat_image_table",
    "reject_single_hwc_image",
    "requires_tensors",
    "seeded_linear",
    "resolve_device",
    "resolve_dtype",
    "to_numpy",
    "torch_compatible_array",
    "user_stacklevel",
]
