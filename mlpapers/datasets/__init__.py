"""Offline datasets: generators and loaders of data shipped inside pip packages.

Conventions
-----------
* Nothing here ever downloads: data is generated, or read from files installed
  with scikit-learn or another wheel.
* Every function returns numpy arrays and takes ``random_state``.
"""

from mlpapers.datasets._digits import make_shifted_digits

__all__ = ["make_shifted_digits"]
