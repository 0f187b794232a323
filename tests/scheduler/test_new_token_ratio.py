import pytest

from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.scheduler.decode import RETRACT_DECODE_STEPS, NewTokenRatio
from sluice.runtime.scheduler.request import Req


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


def test_ratio_after_retraction_reflects_progress_of_survivors():
    survivors = []
    for generated, max_new in [(30, 100), (10, 100)]:
        r = Req(rid=str(generated), input_ids=[1, 2], sampling=SamplingParams(max_new_tokens=max_new))
        r.output_ids = [5] * generated
        survivors.append(r)
    ratio = NewTokenRatio(init=0.7)
    ratio.after_retraction(survivors)
    assert ratio.value == pytest.approx((40 + RETRACT_DECODE_STEPS * 2) / 200)
