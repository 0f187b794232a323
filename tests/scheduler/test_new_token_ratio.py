import pytest

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.scheduler.decode import RETRACT_DECODE_STEPS, NewTokenRatio
from sluice.runtime.scheduler.request import CLIP_MAX_NEW_TOKENS, Req


def test_ratio_decays_linearly_to_its_floor_over_600_ticks():
    ratio = NewTokenRatio(init=0.7)
    ratio.step()
    assert ratio.value == pytest.approx(0.7 - (0.7 - 0.098) / 600)
    for _ in range(598):
        ratio.step()
    assert ratio.value > ratio.floor
    ratio.step()
    assert ratio.value == pytest.approx(0.098)
    for _ in range(100):
        ratio.step()
    assert ratio.value == pytest.approx(0.098)


def test_ratio_resets_to_init():
    ratio = NewTokenRatio(init=0.5)
    for _ in range(50):
        ratio.step()
    ratio.reset()
    assert ratio.value == 0.5


def _survivors(*progress: tuple[int, int]) -> list[Req]:
    out = []
    for generated, max_new in progress:
        r = Req(
            rid=str(generated), input_ids=[1, 2], sampling=SamplingParams(max_new_tokens=max_new)
        )
        r.output_ids = [5] * generated
        out.append(r)
    return out


def test_ratio_after_retraction_reflects_progress_of_survivors():
    # SGLang's estimate: (decoded + 20 per survivor) / total max_new_tokens
    ratio = NewTokenRatio(init=0.7)
    ratio.value = 0.2
    ratio.after_retraction(_survivors((30, 100), (10, 100)))
    assert ratio.value == pytest.approx((40 + RETRACT_DECODE_STEPS * 2) / 200)


def test_ratio_after_retraction_clips_huge_max_tokens_and_never_drops():
    # a chat request without max_tokens gets the rest of the context (here 30k) as its limit;
    # clipped to 4096 as in every other estimate, so the estimate is not ~0
    ratio = NewTokenRatio(init=0.7)
    ratio.value = 0.3
    ratio.after_retraction(_survivors((3000, 30_000), (1000, 30_000)))
    assert ratio.value == pytest.approx(
        (4000 + 2 * RETRACT_DECODE_STEPS) / (2 * CLIP_MAX_NEW_TOKENS)
    )
    high = NewTokenRatio(init=0.7)
    high.after_retraction(_survivors((1, 100)))  # estimate 0.21 < 0.7: a retraction never lowers it
    assert high.value == 0.7
