"""What a new user (coming from PyMC / NumPyro) sees: the result's repr, the summary table,
named dimensions, joining a run with its continuation, the progress bars, the dtype hint."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.sampling import (
    Box,
    ReflectiveHMC,
    SampleResult,
    SampleSummary,
    StiefelSampler,
    ess,
    rhat,
)

# short runs: the split R-hat warning is expected and not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore:the chains disagree:RuntimeWarning")


def gauss(x):
    return -0.5 * (((x - 0.3) / 0.4) ** 2).sum(-1)


BOX = Box([0.0, 0.0, 0.0], [1.0, 1.0, 2.0])


@pytest.fixture(scope="module")
def run():
    hmc = ReflectiveHMC(gauss, BOX, n_leapfrog=3, random_state=0)
    return hmc, hmc.sample(60, warmup=40)


def test_repr_is_one_line_without_the_draws(run):
    _, res = run
    text = repr(res)
    assert "\n" not in text and len(text) < 300
    assert text.startswith("SampleResult(chains=4, draws=60, d=3, ")
    assert "n_divergent=0" in text and "array" not in text


def test_summary_is_the_old_dict_plus_quantiles_and_prints_a_table(run):
    _, res = run
    s = res.summary()
    assert isinstance(s, SampleSummary) and isinstance(s, dict)
    flat = res.samples.reshape(-1, 3)
    np.testing.assert_allclose(s["mean"], flat.mean(0))
    np.testing.assert_allclose(s["median"], np.median(flat, axis=0))
    np.testing.assert_allclose(s["q5"], np.quantile(flat, 0.05, axis=0))
    np.testing.assert_allclose(s["q95"], np.quantile(flat, 0.95, axis=0))
    np.testing.assert_allclose(s["rhat"], rhat(res.samples))
    np.testing.assert_allclose(s["ess_bulk"], ess(res.samples))
    lines = str(s).splitlines()
    assert lines[0].split() == ["mean", "sd", "5%", "50%", "95%", "ess_bulk", "ess_tail",
                                "r_hat"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["x[0]", "x[1]", "x[2]"]
    assert float(lines[1].split()[1]) == pytest.approx(s["mean"][0], abs=1e-3)
    assert "divergent 0" in lines[-1] and repr(s) == str(s)
    back = pickle.loads(pickle.dumps(s))
    assert back.names == s.names and str(back) == str(s)


def test_summary_names_label_rows_and_the_frame(run):
    _, res = run
    s = res.summary(names=["intercept", "slope", "noise"])
    assert [ln.split()[0] for ln in str(s).splitlines()[1:4]] == ["intercept", "slope", "noise"]
    pd = pytest.importorskip("pandas")
    frame = s.to_frame()
    assert isinstance(frame, pd.DataFrame) and list(frame.index) == ["intercept", "slope", "noise"]
    np.testing.assert_allclose(frame["r_hat"].to_numpy(), s["rhat"])
    with pytest.raises(ValueError, match="names has 2 entries but the draws have 3"):
        res.summary(names=["a", "b"])
    with pytest.raises(TypeError, match="sequence of 3 strings"):
        res.summary(names="abc")


@pytest.mark.parametrize("dim", [51, 60])
def test_long_summaries_are_shortened_when_printed(dim):
    # 25 first and 25 last rows and a "(k more)" line; a single elided row is printed
    res = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box(-1.0, 1.0, dim=dim),
                        n_leapfrog=2, random_state=0).sample(8, warmup=4)
    lines = str(res.summary()).splitlines()
    assert len(lines) == 1 + 51 + 2
    if dim == 60:
        assert "(10 more)" in lines[26]
    else:
        assert "more)" not in str(res.summary()) and lines[26].split()[0] == "x[25]"


def test_concat_of_a_run_and_its_resumption_is_the_long_run():
    kw = dict(n_leapfrog=3, mass="diag", random_state=5)
    hmc = ReflectiveHMC(gauss, BOX, **kw)
    first = hmc.sample(30, warmup=40)
    both = first.concat(hmc.sample(20, resume=first))
    long = ReflectiveHMC(gauss, BOX, **kw).sample(50, warmup=40)
    np.testing.assert_array_equal(both.samples, long.samples)
    np.testing.assert_allclose(both.accept_rate, long.accept_rate, rtol=1e-12)
    np.testing.assert_array_equal(both.n_reflections, long.n_reflections)
    np.testing.assert_array_equal(both.n_divergent, long.n_divergent)
    np.testing.assert_array_equal(both.warmup_divergent, long.warmup_divergent)
    assert both.mean_leapfrog == pytest.approx(long.mean_leapfrog, rel=1e-12)
    assert both.n_iterations == long.n_iterations == 50
    np.testing.assert_array_equal(both.last_state, long.last_state)
    again = hmc.sample(10, resume=both)  # the joined result resumes like the last part
    assert again.samples.shape == (4, 10, 3)
    with pytest.raises(ValueError, match="number of chains or the dimension"):
        first.concat(hmc.sample(5, n_chains=2, warmup=5))
    with pytest.raises(TypeError, match="same type"):
        first.concat(first.samples)


def test_stiefel_result_concat_repr_and_names():
    s = StiefelSampler(n=3, k=2, n_leapfrog=2, random_state=0)
    res = s.sample(10, n_chains=2, warmup=10)
    both = res.concat(s.sample(5, resume=res))
    assert both.Q.shape == (2, 15, 3, 2) and both.X.shape == (2, 15, 3, 2)
    assert both.samples.shape == (2, 15, 6)
    assert repr(both).startswith("StiefelResult(chains=2, draws=15, n=3, k=2, ")
    assert str(both.summary()).splitlines()[1].split()[0] == "Q[0,0]"


def test_to_inference_data_with_names(run):
    az = pytest.importorskip("arviz")
    _, res = run
    idata = res.to_inference_data(names=["a", "b", "c"])
    assert list(idata.posterior["x"].coords["x_dim_0"].values) == ["a", "b", "c"]
    assert list(az.summary(idata).index) == ["x[a]", "x[b]", "x[c]"]


def test_verbose_shows_a_warmup_bar_then_a_sampling_bar(capsys):
    ReflectiveHMC(gauss, BOX, n_leapfrog=2, verbose=1, random_state=0).sample(5, warmup=4)
    err = capsys.readouterr().err
    assert "ReflectiveHMC warmup" in err and "ReflectiveHMC sampling" in err
    assert err.index("warmup") < err.index("sampling") and "divergent=0" in err


def test_float32_data_in_log_prob_hint_names_the_data_tensors():
    X = torch.ones(5, 3, dtype=torch.float32)  # data built as float32, chains float64

    def log_prob(theta):
        return -((theta @ X.T) ** 2).sum(-1)

    with pytest.raises(RuntimeError, match=r"dtype=torch\.float32.*torch\.as_tensor"):
        ReflectiveHMC(log_prob, BOX, random_state=0).sample(5, warmup=2)


def test_result_is_still_a_dataclass_with_its_fields(run):
    _, res = run
    assert isinstance(res, SampleResult) and "samples" in SampleResult.__dataclass_fields__


def test_one_point_log_prob_gets_a_vmap_hint_and_vmap_works():
    def one_point(t):  # written for (d,), as a NumPyro potential
        return -0.5 * t @ t

    with pytest.raises(RuntimeError, match=r"shape \(4, 3\).*torch\.vmap"):
        ReflectiveHMC(one_point, BOX, random_state=0).sample(5, warmup=2)
    kw = dict(n_leapfrog=3, random_state=0)
    a = ReflectiveHMC(torch.vmap(one_point), BOX, **kw).sample(20, warmup=10).samples
    b = ReflectiveHMC(lambda t: -0.5 * (t * t).sum(-1), BOX, **kw).sample(20, warmup=10).samples
    np.testing.assert_array_equal(a, b)


def test_a_chain_count_passed_as_x0_says_to_use_n_chains():
    with pytest.raises(ValueError, match="pass n_chains=4 by keyword"):
        ReflectiveHMC(gauss, BOX, random_state=0).sample(10, 4)


def _notes(exc_info):
    return "\n".join(getattr(exc_info.value, "__notes__", []))


def test_start_errors_keep_their_type_and_get_a_hint_only_when_it_fits():
    def unpack(x):  # one point (3,): fails with a ValueError on the (4, 3) batch
        a, b, c = x
        return -(a * a + b * b + c * c)

    with pytest.raises(ValueError, match="too many values") as info:
        ReflectiveHMC(unpack, BOX, random_state=0).sample(5, warmup=2)
    assert "torch.vmap" in _notes(info)
    W = torch.ones(4, 3, dtype=torch.float64)  # a batched log_prob with a shape bug of its own
    with pytest.raises(RuntimeError, match="cannot be multiplied") as info:
        ReflectiveHMC(lambda x: -(x @ W).sum(-1), BOX, random_state=0).sample(5, warmup=2)
    assert _notes(info) == ""

    def oom(x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        ReflectiveHMC(oom, BOX, random_state=0).sample(5, warmup=2)

    def long_vs_double(x):
        raise RuntimeError("expected scalar type Long but found Double")

    with pytest.raises(RuntimeError) as info:
        ReflectiveHMC(long_vs_double, BOX, random_state=0).sample(5, warmup=2)
    assert _notes(info) == ""
    # an error of grad_log_prob is not blamed on log_prob
    with pytest.raises(RuntimeError) as info:
        ReflectiveHMC(gauss, BOX, grad_log_prob=lambda x: x @ x, random_state=0).sample(5)
    assert "log_prob" not in str(info.value) and _notes(info) == ""
    W32 = torch.ones(3, 3, dtype=torch.float32)
    with pytest.raises(RuntimeError) as info:
        ReflectiveHMC(gauss, BOX, grad_log_prob=lambda x: x @ W32, random_state=0).sample(5)
    assert _notes(info).startswith("grad_log_prob failed on the torch.float64 chains")
    assert "dtype=torch.float32" in _notes(info)


def test_only_an_integer_x0_is_taken_for_a_chain_count():
    with pytest.raises(ValueError, match=r"x0 must have shape \(3,\)") as info:
        ReflectiveHMC(gauss, BOX, random_state=0).sample(5, 0.5)
    assert "n_chains=0.5" not in str(info.value)
    with pytest.raises(ValueError, match=r"got 8; for the number of chains pass n_chains=8 by"):
        ReflectiveHMC(gauss, BOX, random_state=0).sample(5, np.int64(8))


def test_names_accept_any_iterable_of_labels_and_reject_duplicates(run):
    pd = pytest.importorskip("pandas")
    _, res = run
    for names in (pd.Index(["a", "b", "c"]), pd.Series(["a", "b", "c"]),
                  dict(a=1, b=2, c=3).keys(), np.array(["a", "b", "c"]), ("a", "b", "c")):
        assert res.summary(names=names).names == ["a", "b", "c"]
    with pytest.raises(ValueError, match="one-dimensional"):
        res.summary(names=np.array("abc"))
    with pytest.raises(ValueError, match="distinct.*'a' repeated"):
        res.summary(names=["a", "b", "a"])
    with pytest.raises(TypeError, match="sequence of 3 strings"):
        res.summary(names="abc")




def test_stiefel_bars_are_labelled_stiefel_sampler(capsys):
    StiefelSampler(n=3, k=2, n_leapfrog=2, verbose=1, random_state=0).sample(
        3, n_chains=2, warmup=2)
    err = capsys.readouterr().err
    assert "StiefelSampler warmup" in err and "StiefelSampler sampling" in err
    assert "ReflectiveHMC" not in err


def test_a_one_dimensional_x0_of_the_wrong_length_is_reported_as_given():
    # regression: the error showed the (n_chains, d) expansion of a (d,) x0
    from mlpapers.sampling.rehmc import Ball, ReflectiveHMC

    hmc = ReflectiveHMC(lambda x: -0.5 * (x * x).sum(-1), Ball(np.zeros(3), 2.0),
                        random_state=0)
    with pytest.raises(ValueError, match=r"x0 must have shape \(3,\) or \(2, 3\).*got \(4,\)"):
        hmc.sample(5, np.zeros(4), n_chains=2, warmup=5)


@pytest.mark.parametrize("missing", ["hit", "interior_point"])
def test_a_user_container_missing_an_oracle_is_named(missing):
    # regression: an empty NotImplementedError, naming neither the class nor the method
    from mlpapers.sampling.rehmc import ConvexContainer, ReflectiveHMC

    def contains(self, x, tol=0.0):
        return (x.abs() < 1).all(-1)

    def hit(self, x, v, t_max=None, exclude=None):
        raise AssertionError("not reached")

    methods = {"dim": 2, "contains": contains, "hit": hit,
               "interior_point": lambda self: np.zeros(2)}
    del methods[missing]
    Box = type("Box", (ConvexContainer,), methods)
    hmc = ReflectiveHMC(lambda x: -0.5 * (x * x).sum(-1), Box(), random_state=0)
    with pytest.raises(NotImplementedError, match=f"Box must implement {missing}"):
        hmc.sample(5, n_chains=2, warmup=5)


def test_summary_of_a_hand_built_auto_length_result_gives_nan_reflections_per_step():
    # regression: float("auto") raised in reflections_per_step
    from mlpapers.sampling.rehmc._result import SampleResult

    x = np.random.default_rng(0).standard_normal((2, 50, 3))
    res = SampleResult(samples=x, accept_rate=np.ones(2), n_reflections=np.zeros(2, int),
                       n_divergent=np.zeros(2, int), kept_fraction=np.ones(2),
                       step_size=np.ones(2), inv_mass=np.ones(3), n_iterations=50,
                       n_leapfrog="auto")
    assert np.isnan(res.reflections_per_step)
    res.summary()  # (runs through)
    fixed = SampleResult(**{**{f: getattr(res, f) for f in SampleResult.__dataclass_fields__},
                            "n_leapfrog": 4, "n_reflections": np.array([4, 12])})
    assert fixed.reflections_per_step == 16 / (50 * 4 * 2)


@pytest.mark.parametrize("x, v, name", [
    ([0.0, 0.0], [np.nan, 1.0], "v"), ([0.0, 0.0], [np.inf, 0.0], "v"),
    ([np.nan, 0.0], [1.0, 1.0], "x"),
])
def test_hit_refuses_non_finite_points_and_velocities_given_as_arrays(x, v, name):
    # regression: a NaN velocity gave t = inf ("never leaves"), a NaN point t = NaN
    from mlpapers.sampling.rehmc import Ball, Box

    for K in (Ball(np.zeros(2), 1.0), Box(-np.ones(2), np.ones(2))):
        with pytest.raises(ValueError, match=f"hit: {name} must be finite"):
            K.hit(np.array(x), np.array(v))
    assert Ball(np.zeros(2), 1.0).hit(np.zeros(2), np.array([2.0, 0.0])).t == 0.5
