"""The samplers' own laws at their scale b, against scipy's distributions (not the project's).

Gumbel(0, b) has CDF exp(-exp(-z/b)) (scipy.stats.gumbel_r(scale=b)); Laplace(0, b) has CDF
1/2 exp(z/b) for z < 0 and 1 - 1/2 exp(-z/b) otherwise (scipy.stats.laplace(scale=b)); the
mechanisms' calibration (Fact 3.2, Fact 3.3; privacy.calibrate) is only as good as a noise drawn
at exactly the scale it names. Every sampler of the core is tested at scales 0.25, 0.6, 3 and 12
(never 1, where b = 1/b): the direct draw (noise.py), the inverse survival map the lazy list
uses, the eager list, the lazy list's random access (Algorithm 4) and the keyed noise of the
in-store one-shot (keyed_noise.py). One-sample KS, 3,000 draws, fixed seeds, p > ALPHA = 1e-3.
Power: at these sizes a draw at scale 1/b, or at 1.5 b, gives p < 1e-6 (asserted below, so the
tests are shown able to fail on exactly that mistake).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests.helpers import assert_varies
from topk_middleware.keyed_noise import KeyedNoise
from topk_middleware.lazy_noise import LazyNoiseList
from topk_middleware.noise import Gumbel, Laplace, make_noise
from topk_middleware.noise_list import EagerNoiseList

ALPHA = 1e-3
SCALES = [0.25, 0.6, 3.0, 12.0]
DRAWS = 3_000
NOISES = ["gumbel", "laplace"]


def scipy_law(noise: str, scale: float):
    return stats.gumbel_r(scale=scale) if noise == "gumbel" else stats.laplace(scale=scale)


def assert_law(sample: np.ndarray, noise: str, scale: float) -> None:
    """KS against the law at `scale` passes; against 1/scale and 1.5 x scale it fails."""
    assert_varies(sample, f"{noise} draws")
    assert stats.kstest(sample, scipy_law(noise, scale).cdf).pvalue > ALPHA
    for wrong in (1.0 / scale, 1.5 * scale):
        assert stats.kstest(sample, scipy_law(noise, wrong).cdf).pvalue < 1e-6, wrong


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("noise", NOISES)
def test_direct_draws_have_the_law_at_their_scale(noise: str, scale: float) -> None:
    """Gumbel.sample / Laplace.sample (the one-shot mechanism's noise vector)."""
    distribution = make_noise(noise, scale)
    assert distribution.scale == scale and distribution.name == noise
    sample = distribution.sample(np.random.default_rng(int(scale * 100)), DRAWS)
    assert sample.shape == (DRAWS,)
    assert_law(sample, noise, scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("noise", NOISES)
def test_the_eager_list_draws_the_law_at_its_scale(noise: str, scale: float) -> None:
    eager = EagerNoiseList.draw(make_noise(noise, scale), DRAWS, np.random.default_rng(7))
    assert_law(eager.noises_of(np.arange(DRAWS)), noise, scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("noise", NOISES)
def test_survival_and_its_inverse_are_the_laws(noise: str, scale: float) -> None:
    """survival(z) = scipy's sf(z) (to 1e-12 relative, deep in both tails), from_survival is its
    inverse, and from_survival of uniforms has the law (how the lazy list makes its noises)."""
    distribution = make_noise(noise, scale)
    law = scipy_law(noise, scale)
    z = np.linspace(-8.0, 40.0, 97) * scale
    np.testing.assert_allclose(distribution.survival(z), law.sf(z), rtol=1e-12, atol=0)
    v = np.concatenate([10.0 ** -np.arange(1, 300, 7.0), np.linspace(0.01, 0.99, 50)])
    np.testing.assert_allclose(distribution.from_survival(v), law.isf(v), rtol=1e-10, atol=1e-12)
    uniforms = np.random.default_rng(11).random(DRAWS)
    assert_law(distribution.from_survival(uniforms), noise, scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("noise", NOISES)
def test_lazy_random_access_has_the_law_at_its_scale(noise: str, scale: float) -> None:
    """The first random access of a lazy list (Algorithm 4) is one draw of the noise law; so is
    the noise of an item placed after sorted accesses (its neighbours known)."""
    distribution = make_noise(noise, scale)
    first, later = [], []
    for child in np.random.default_rng(13).spawn(DRAWS):
        noise_list = LazyNoiseList(distribution, 10**6, child)
        first.append(noise_list.noise_of(17))
        noise_list.next_sorted_batch(2)
        later.append(noise_list.noise_of(99))
    assert_law(np.asarray(first), noise, scale)
    assert_law(np.asarray(later), noise, scale)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("noise", NOISES)
def test_keyed_noise_has_the_law_at_its_scale(noise: str, scale: float) -> None:
    """The in-store one-shot's noise, as the stores compute it (KeyedNoise.noises is the
    reference the stores are tested against): unsplit and split (exceedances drawn by the
    client above the level, keyed noise conditioned below it)."""
    rng = np.random.default_rng(17)
    unsplit = KeyedNoise.draw(rng, noise, scale)
    assert unsplit.scale == scale
    assert_law(unsplit.noises(np.arange(DRAWS)), noise, scale)
    split = KeyedNoise.draw(rng, noise, scale, DRAWS, 1, exceedances=300)
    assert 0 < len(split.exceed_positions) < DRAWS
    assert_law(split.noises(np.arange(DRAWS)), noise, scale)


def test_the_classes_hold_their_scale() -> None:
    assert Gumbel(2.5).scale == 2.5 and Laplace(0.4).scale == 0.4
    with pytest.raises(ValueError, match="noise must be"):
        make_noise("cauchy", 1.0)


@pytest.mark.parametrize("noise", NOISES)
def test_one_value_maps_as_an_array_does(noise: str) -> None:
    """from_survival of one Python float (the lazy list's scalar accesses, on a numpy scalar) is
    bit for bit the array's value, at the ends included (v = 0 and 1: the infinite noises;
    subnormal, just around 1/2, NaN and out of range: as numpy gives them). Fails with math's
    log where numpy's is a SIMD loop that rounds otherwise (AVX-512: 1 value in 20 to 40)."""
    distribution = make_noise(noise, 0.6)
    rng = np.random.default_rng(12)
    edges = [0.0, 1.0, 0.5, 5e-324, np.nextafter(0.5, 1), np.nextafter(0.5, 0), 1 - 2**-53]
    edges += [np.nan, 1.5, -0.25]
    v = np.concatenate([rng.random(2_000), rng.random(500) * 1e-300, 1 - rng.random(500) * 1e-12])
    v = np.concatenate([v, edges])
    with np.errstate(all="ignore"):
        array = np.asarray(distribution.from_survival(v))
        one = [distribution.from_survival(float(x)) for x in v.tolist()]
    assert all(isinstance(z, float) for z in one[:3_000])
    one_array = np.asarray(one, dtype=np.float64)
    assert np.array_equal(array, one_array, equal_nan=True)
    assert np.array_equal(np.signbit(array), np.signbit(one_array))
