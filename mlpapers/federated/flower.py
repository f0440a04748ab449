"""Flower integration of the federated algorithms (needs the ``flower`` extra).

``CLoVEStrategy`` is a Flower server ``Strategy`` running CLoVE's loss-vector
clustering; ``make_client_app`` builds the matching client app.
"""

try:
    from mlpapers.federated.clove._flower import CLoVEStrategy, make_client_app
except ModuleNotFoundError as exc:  # the flower extra is not installed
    if exc.name is None or exc.name.split(".")[0] != "flwr":
        raise
    # (a ModuleNotFoundError naming flwr, as the bare import gave: code that skips a
    # missing optional extra by that name keeps working)
    raise ModuleNotFoundError(
        "mlpapers.federated.flower needs Flower (flwr): pip install 'mlpapers[flower]'",
        name="flwr",
    ) from exc

__all__ = ["CLoVEStrategy", "make_client_app"]
