"""``save`` writes through a temporary file moved into place once complete.

It wrote in place: a save that failed partway (disk full, a file size limit) truncated
the previous model file to an unloadable fragment, or left a partial new file, and the
error was torch's "[enforce fail at inline_container.cc] unexpected pos".
"""

import os
import stat

import numpy as np
import pytest

from mlpapers.retrieval import ExactMIPS

resource = pytest.importorskip("resource")   # (POSIX: the file size limit)

SMALL = np.ones((10, 4))
BIG = np.random.default_rng(0).normal(size=(20000, 8))   # about 640 kB saved


def _limited_file_size(limit):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_partial_one(tmp_path):
    path = tmp_path / "m.pt"
    ExactMIPS().fit(SMALL).save(path)
    before = path.read_bytes()
    big = ExactMIPS().fit(BIG)
    restore = _limited_file_size(200_000)
    try:
        with pytest.raises(OSError, match="could not be written"):
            big.save(path)
        with pytest.raises(OSError):
            big.save(tmp_path / "new.pt")
    finally:
        restore()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.pt"]
    np.testing.assert_array_equal(ExactMIPS.load(path).predict(SMALL),
                                  ExactMIPS().fit(SMALL).predict(SMALL))


def test_an_interrupted_save_keeps_the_previous_file(tmp_path, monkeypatch):
    import torch

    path = tmp_path / "m.pt"
    ExactMIPS().fit(SMALL).save(path)
    before = path.read_bytes()

    def interrupted(obj, f, *a, **k):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ExactMIPS().fit(BIG).save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.pt"]


def test_save_keeps_permissions_and_writes_through_links(tmp_path):
    path = tmp_path / "m.pt"
    ExactMIPS().fit(SMALL).save(path)
    os.chmod(path, 0o600)
    link = tmp_path / "link.pt"
    link.symlink_to(path)
    ExactMIPS().fit(BIG).save(link)
    assert link.is_symlink() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ExactMIPS.load(link).n_features_in_ == 8
    assert sorted(os.listdir(tmp_path)) == ["link.pt", "m.pt"]
