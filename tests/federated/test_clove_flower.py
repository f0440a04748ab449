"""CLoVE on a real local Flower deployment: 1 SuperLink + 3 SuperNodes on loopback.

Skipped unless the ``flower`` extra (``flwr >= 1.42``) is installed. No mock: the
daemons run as subprocesses (insecure mode, no Ray) and ``flwr run`` submits a
small app whose ServerApp uses :class:`CLoVEStrategy`.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from sklearn.metrics import adjusted_rand_score  # noqa: E402

N_NODES = 3

SERVER = '''
import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from mlpapers.federated.clove._flower import CLoVEStrategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    gen = torch.Generator().manual_seed(0)
    models = []
    for _ in range(int(cfg["k"])):
        m = torch.nn.Linear(int(cfg["d"]), 1)
        with torch.no_grad():
            m.weight.copy_(torch.randn(1, int(cfg["d"]), generator=gen))
        models.append(ArrayRecord(m.state_dict()))
    strategy = CLoVEStrategy(n_clusters=int(cfg["k"]), min_nodes=int(cfg["nodes"]),
                             random_state=0)
    strategy.start(grid, models, num_rounds=int(cfg["rounds"]), timeout=120,
                   train_config=ConfigRecord({"seed": 0}))
    labels = {str(strategy.partitions_[nid]): lab for nid, lab in strategy.labels_.items()}
    with open(cfg["out"], "w") as f:
        json.dump({"labels": labels, "history": strategy.history_}, f)
'''

CLIENT = '''
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated.clove._flower import make_client_app


def data_fn(context):
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=300, n_features=5, random_state=0)
    return clients[int(context.node_config["partition-id"])]


app = make_client_app(lambda: torch.nn.Linear(5, 1), data_fn, loss="mse",
                      local_epochs=10, lr=0.05, batch_size=100)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} executable not found next to {sys.executable}")
    return str(path)


def _wait_ready(port: int, superlink_log: Path, timeout: float) -> None:
    """Wait until the SuperLink answers /health and every SuperNode registered."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                healthy = r.status == 200
        except OSError:
            healthy = False
        if healthy and superlink_log.read_text().count("activate-node") >= N_NODES:
            return
        time.sleep(0.5)
    pytest.fail(f"Flower deployment not ready after {timeout} s:\n"
                f"{superlink_log.read_text()[-2000:]}")


def _write_app(root: Path, out: Path) -> Path:
    app = root / "clove_app"
    pkg = app / "clove_fl"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server_app.py").write_text(SERVER)
    (pkg / "client_app.py").write_text(CLIENT)
    (app / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "clove-fl"
        version = "1.0.0"
        description = "CLoVE integration test"
        license = "BSD-3-Clause"
        dependencies = ["flwr>=1.42"]

        [tool.hatch.build.targets.wheel]
        packages = ["."]

        [tool.flwr.app]
        publisher = "mlpapers"

        [tool.flwr.app.components]
        serverapp = "clove_fl.server_app:app"
        clientapp = "clove_fl.client_app:app"

        [tool.flwr.app.config]
        k = 2
        d = 5
        nodes = {N_NODES}
        rounds = 2
        out = "{out}"
    """))
    return app


@pytest.mark.slow
def test_clove_on_a_local_flower_deployment(tmp_path):
    port = _free_port()
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", OMP_NUM_THREADS="1",
               # the daemons spawn flower-superexec / flwr-serverapp / flwr-clientapp by name
               PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                     os.environ.get("PATH", "")]))
    out = tmp_path / "result.json"
    app = _write_app(tmp_path, out)
    logs = []
    procs = []

    def spawn(args, name):
        log = open(tmp_path / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=tmp_path, start_new_session=True))

    try:
        spawn([_bin("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
               "--host", "127.0.0.1", "--port", str(port)], "superlink")
        for i in range(N_NODES):
            spawn([_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                   "--port", str(_free_port()), "--max-wait-time", "120",
                   "--node-config", f"partition-id={i} num-partitions={N_NODES}"],
                  f"node{i}")
        _wait_ready(port, tmp_path / "superlink.log", timeout=120)
        run = subprocess.run([_bin("flwr"), "run", str(app), "loopback", "--stream"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=240)
        (tmp_path / "flwr_run.log").write_text(run.stdout + run.stderr)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert out.exists(), (run.stdout[-3000:], run.stderr[-3000:],
                              (tmp_path / "superlink.log").read_text()[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()

    result = json.loads(out.read_text())
    labels = [result["labels"][str(i)] for i in range(N_NODES)]
    truth = np.repeat([0, 1], 2)[:N_NODES]
    assert adjusted_rand_score(truth, labels) == 1.0
    losses = [h["loss"] for h in result["history"]]
    assert len(losses) == 2 and losses[-1] < 0.1 * losses[0]
