"""Flower integration of the federated algorithms (needs the ``flower`` extra).

``CLoVEStrategy`` is a Flower server ``Strategy`` running CLoVE's loss-vector
clustering; ``make_client_app`` builds the matching client app.
"""

from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app

__all__ = ["CLoVEStrategy", "make_client_app"]
