"""`sluice_cpu.linear`, the bf16 linear layer of the CPU path, on every instruction path this
CPU has (AMX, AVX512-BF16, AVX2: each is forced here, whatever `auto` would pick).

Oracle: float64 matmul of the same bf16 values. The contract that matters for serving: a
row's output is bitwise the same however many rows share the call, whatever the thread
count, and (AMX) whichever of the two operand orders computes it.
"""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.kernels import cpu_extension

pytestmark = pytest.mark.skipif(not cpu_extension.available(), reason="CPU kernels not built")

NAMES = {0: "avx2", 1: "avx512bf16", 2: "amx"}
AMX = 2
# row counts on both sides of every threshold of the kernels (16/32-row tiles, the order
# switch at 128 rows, the 1024-row chunk) and SmolLM2's shapes (K = 576, 1536)
ROW_COUNTS = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 128, 129, 300, 1100]
SHAPES = [(576, 960), (1536, 576), (576, 4096), (100, 37), (64, 33), (40, 50)]


def paths() -> list[int]:
    return list(torch.ops.sluice_cpu.linear_paths()) if cpu_extension.available() else []


def _case(k: int, n: int, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    return x, w


def _usable(path: int, k: int) -> bool:
    return path != AMX or k % 32 == 0


def test_this_cpu_has_a_path_and_avx2_is_always_among_them_on_x86() -> None:
    assert paths(), "no linear path on this CPU"
    flags = open("/proc/cpuinfo").read()
    if " avx2 " in flags:
        assert 0 in paths()
    if "avx512_bf16" in flags:
        assert 1 in paths()


@pytest.mark.parametrize("path", paths(), ids=lambda p: NAMES[p])
@pytest.mark.parametrize("k,n", SHAPES, ids=lambda v: str(v))
def test_fp32_output_matches_float64_within_fp32_summation_error(path: int, k: int, n: int) -> None:
    if not _usable(path, k):
        pytest.skip("amx needs K in multiples of 32")
    x, w = _case(k, n, 70)
    got = torch.ops.sluice_cpu.linear(x, w, None, torch.float32, path)
    exact = x.double() @ w.double().T
    # bf16 x bf16 products are exact in fp32; only the K additions round
    bound = k * 2.0**-23 * (x.double().abs() @ w.double().abs().T)
    assert got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= bound + 1e-30).all()


@pytest.mark.parametrize("path", paths(), ids=lambda p: NAMES[p])
def test_bf16_output_with_bias_is_the_rounded_fp32_result(path: int) -> None:
    x, w = _case(576, 960, 40)
    bias = torch.randn(960).bfloat16()
    got = torch.ops.sluice_cpu.linear(x, w, bias, torch.bfloat16, path)
    fp32 = torch.ops.sluice_cpu.linear(x, w, bias, torch.float32, path)
    assert got.dtype == torch.bfloat16
    # the same fp32 sum plus bias (checked against float64 above), rounded to nearest once
    assert torch.equal(got, fp32.bfloat16())
    exact = x.double() @ w.double().T + bias.double()
    assert ((got.double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-6).all()


@pytest.mark.parametrize("path", paths(), ids=lambda p: NAMES[p])
@pytest.mark.parametrize("k,n", SHAPES[:3] + SHAPES[4:5], ids=lambda v: str(v))
def test_a_row_gives_the_same_bits_whatever_else_shares_the_call(path: int, k: int, n: int) -> None:
    if not _usable(path, k):
        pytest.skip("amx needs K in multiples of 32")
    x, w = _case(k, n, max(ROW_COUNTS))
    alone = torch.cat([torch.ops.sluice_cpu.linear(x[i : i + 1], w, None, torch.float32, path)
                       for i in range(40)])  # fmt: skip
    for rows in ROW_COUNTS:
        if path == 0 and rows > 200:
            continue  # the avx2 dot products are slow at this size; they have no row tiles
        out = torch.ops.sluice_cpu.linear(x[:rows], w, None, torch.float32, path)
        shown = min(rows, 40)
        assert torch.equal(out[:shown], alone[:shown]), f"{rows} rows change a row's result"
        if rows > 40:  # the last rows (a partial tile) against themselves alone
            last = torch.ops.sluice_cpu.linear(x[rows - 1 : rows], w, None, torch.float32, path)
            assert torch.equal(out[rows - 1 :], last)


@pytest.mark.parametrize("path", paths(), ids=lambda p: NAMES[p])
def test_the_thread_count_does_not_change_the_bits(path: int) -> None:
    x, w = _case(576, 960, 50)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.sluice_cpu.linear(x, w, None, torch.bfloat16, path)
        torch.set_num_threads(max(2, before))
        many = torch.ops.sluice_cpu.linear(x, w, None, torch.bfloat16, path)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


TWO_ORDERS = [path for path in paths() if path == AMX]


@pytest.mark.parametrize("path", TWO_ORDERS, ids=lambda p: NAMES[p])
@pytest.mark.parametrize("rows", [1, 16, 17, 64, 65, 300])
@pytest.mark.parametrize("k", [576, 100])
def test_both_operand_orders_give_the_same_bits(path: int, rows: int, k: int) -> None:
    if not _usable(path, k):
        pytest.skip("amx needs K in multiples of 32")
    x, w = _case(k, 1000, rows)
    rows_first = torch.ops.sluice_cpu.linear_order(x, w, path, 0)
    weight_first = torch.ops.sluice_cpu.linear_order(x, w, path, 1)
    assert torch.equal(rows_first, weight_first)


def test_inputs_it_cannot_take_are_refused_with_the_reason() -> None:
    x, w = _case(64, 8, 4)
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.sluice_cpu.linear(x.float(), w, None, torch.float32, -1)
    with pytest.raises(RuntimeError, match="differ in K"):
        torch.ops.sluice_cpu.linear(x[:, :32], w, None, torch.float32, -1)
    with pytest.raises(RuntimeError, match="output dtype"):
        torch.ops.sluice_cpu.linear(x, w, None, torch.float16, -1)
    with pytest.raises(RuntimeError, match="not available"):
        torch.ops.sluice_cpu.linear(x, w, None, torch.float32, 7)


def test_empty_and_strided_inputs() -> None:
    x, w = _case(64, 8, 6)
    assert torch.ops.sluice_cpu.linear(x[:0], w, None, torch.float32, -1).shape == (0, 8)
    strided = x[::2]  # rows two apart: the kernel reads rows at their stride
    assert torch.equal(torch.ops.sluice_cpu.linear(strided, w, None, torch.float32, -1),
                       torch.ops.sluice_cpu.linear(strided.contiguous(), w, None, torch.float32, -1))  # fmt: skip
