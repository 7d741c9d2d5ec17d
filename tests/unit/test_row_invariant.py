"""The row-invariant float32 kernel: F.linear's values, and a row's bits whatever rows share the call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from completion_engine import row_invariant
from completion_engine.runner import DecoderRunner
from tests.conftest import numerics_or_skip

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def kernel_built():
    # CI and the README's machines have a C++ compiler and an AVX2 CPU: the kernel must build there
    assert row_invariant.usable(torch.float32, CPU), "the row-invariant kernel did not build (see the log)"


@pytest.mark.parametrize("out_features, in_features", [(96, 64), (37, 19), (5, 3), (576, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_are_those_of_f_linear(out_features, in_features, with_bias):
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    x = torch.randn(20, in_features, generator=generator)
    got = row_invariant.pack(weight, bias)(x)
    assert got.shape == (20, out_features)
    assert torch.allclose(got, F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("out_features, in_features", [(96, 64), (37, 300), (3072, 576)])
def test_a_row_has_the_same_bits_at_every_row_count_place_and_thread_count(out_features, in_features):
    generator = torch.Generator().manual_seed(in_features)
    linear = row_invariant.pack(
        torch.randn(out_features, in_features, generator=generator),
        torch.randn(out_features, generator=generator),
    )
    x = torch.randn(130, in_features, generator=generator)
    reference = torch.cat([linear(row[None]) for row in x])  # one row per call
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):  # 3: uneven shares, more threads than cores
            torch.set_num_threads(count)
            for rows in (2, 3, 4, 7, 16, 128, 130):
                for first in (0, 1, 2):
                    block = x[first : first + rows]
                    assert torch.equal(linear(block), reference[first : first + len(block)]), (rows, first)
    finally:
        torch.set_num_threads(threads)


def test_non_contiguous_input_gives_the_same_bits():
    generator = torch.Generator().manual_seed(3)
    linear = row_invariant.pack(torch.randn(48, 40, generator=generator))
    wide = torch.randn(6, 80, generator=generator)
    assert torch.equal(linear(wide[:, ::2]), linear(wide[:, ::2].contiguous()))


@pytest.mark.skipif("avx512f" not in row_invariant.cpu_flags(), reason="the CPU has no AVX-512")
def test_512_bit_verify_tiles_give_the_bits_of_256_bit_ones():
    # 2 to 16 rows run 512-bit tiles of up to 12 rows (bf16 and float32 panels); 1 row and prefill
    # blocks the 256-bit ones either way
    module = row_invariant.kernel()
    generator = torch.Generator().manual_seed(11)
    weight = torch.randn(200, 300, generator=generator).bfloat16().float()  # k = 300: three k blocks
    x = torch.randn(40, 300, generator=generator)
    threads, before = torch.get_num_threads(), module.set_wide_tiles(True)
    try:
        with row_invariant.numerics_mode("float32"):  # float32 inputs: the tiles of the fma chains
            for count in (1, 2):
                torch.set_num_threads(count)
                for panels in (module.pack_bf16(weight), module.pack(weight)):
                    for rows in (*range(1, 18), 40):
                        module.set_wide_tiles(True)
                        got = module.linear(x[:rows], panels, 200, None)
                        assert module.set_wide_tiles(False)  # they were on
                        expected = module.linear(x[:rows], panels, 200, None)
                        assert torch.equal(got, expected), (panels.dtype, rows, count)
    finally:
        module.set_wide_tiles(before)
        torch.set_num_threads(threads)


def test_wrong_dtype_is_a_clear_error():
    with pytest.raises(RuntimeError, match="float32"):
        row_invariant.pack(torch.randn(8, 8, dtype=torch.bfloat16))
    linear = row_invariant.pack(torch.randn(8, 8))
    with pytest.raises(RuntimeError, match="float32"):
        linear(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="do not fit"):
        linear(torch.randn(2, 9))


def test_float32_runners_use_it_and_decode_one_row_at_a_time(tiny_target_fp32, tiny_target):
    """The point of the kernel: a float32 decode step runs 1 row, not a padded bucket."""
    runner = DecoderRunner(tiny_target_fp32.weights, exact=True, capacity=256)
    assert runner.row_invariant_kernel and runner.decode_buckets[0] == 1
    assert not DecoderRunner(tiny_target.weights, exact=True, capacity=256).row_invariant_kernel  # bf16
    again = DecoderRunner(tiny_target_fp32.weights, exact=True, capacity=256)
    assert again.linears is runner.linears  # packed once per set of weights


def test_it_can_be_turned_off(monkeypatch, tiny_target_fp32):
    monkeypatch.setenv("SPEC_COMPLETE_ROW_KERNEL", "0")
    assert not DecoderRunner(tiny_target_fp32.weights, exact=True, capacity=256).row_invariant_kernel


def test_the_kv_cache_panel_layout_holds_what_was_written():
    from completion_engine.kv import PANEL, KVCache

    generator = torch.Generator().manual_seed(5)
    plain = KVCache(2, 3, 40, 256, torch.float32, CPU)  # head_dim 40: values pad to 2 panels of 32
    panels = KVCache(2, 3, 40, 256, torch.float32, CPU, panels=True)
    for start, count in ((0, 30), (30, 5), (35, 128), (163, 1)):  # across panel and bucket boundaries
        k, v = torch.randn(2, 3, count, 40, generator=generator)
        for cache in (plain, panels):
            cache.write(1, start, k, v)
    keys = panels.keys[1].permute(0, 1, 3, 2).reshape(3, -1, 40)  # [kv_head, position, head_dim]
    values = panels.values[1].permute(0, 2, 1, 3).reshape(3, 256, -1)[:, :, :40]
    assert torch.equal(keys[:, :164], plain.keys[1, :, :164])
    assert torch.equal(values[:, :164], plain.values[1, :, :164])
    assert panels.keys.shape == (2, 3, 256 // PANEL, 40, PANEL)


def test_bf16_valued_weights_pack_into_bf16_panels_with_the_bits_of_float32_ones():
    generator = torch.Generator().manual_seed(9)
    weight = torch.randn(100, 200, generator=generator).bfloat16().float()
    bias = torch.randn(100, generator=generator)
    narrow, wide = row_invariant.pack(weight, bias), row_invariant.pack(weight, bias, bf16=False)
    assert narrow.panels.dtype == torch.bfloat16 and wide.panels.dtype == torch.float32
    x = torch.randn(40, 200, generator=generator)
    threads = torch.get_num_threads()
    try:
        with row_invariant.numerics_mode("float32"):  # float32 inputs: the chains of float32 panels
            for count in (1, 2, 3):  # 3: uneven shares, more threads than cores
                torch.set_num_threads(count)
                # whole panels in registers up to 3 rows, half-panel tiles of 3-6 rows up to 16, widened
                # blocks beyond; k = 200 spans two k blocks, so the chains park in acc between them
                for rows in (*range(1, 18), 40):
                    assert torch.equal(narrow(x[:rows]), wide(x[:rows])), rows
    finally:
        torch.set_num_threads(threads)


BF16_NUMERICS = ["bf16dot", "amx"]


@pytest.mark.parametrize("numerics", BF16_NUMERICS)
@pytest.mark.parametrize(
    "out_features, in_features", [(100, 300), (576, 1536), (45, 64), (40, 34), (57, 300), (48, 34)]
)
def test_the_bf16_dot_mode_multiplies_bf16_inputs_and_gives_a_row_the_same_bits_in_any_company(
    numerics, out_features, in_features
):
    # amx: k = 300 and 34 end in a part block of 32, 130 rows in a part tile of 16; 57 and 48 outputs:
    # a last panel of 25 and 16 columns
    # k = 300: three k blocks (the chains park between them); 45 outputs: a part panel
    generator = torch.Generator().manual_seed(in_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16().float()
    bias = torch.randn(out_features, generator=generator)
    linear = row_invariant.pack(weight, bias)
    assert linear.panels.dtype == torch.bfloat16
    x = torch.randn(130, in_features, generator=generator)
    threads = torch.get_num_threads()
    try:
        with numerics_or_skip(numerics):
            reference = torch.cat([linear(row[None]) for row in x])  # one row per call
            exact = x.bfloat16().double() @ weight.double().T + bias.double()  # the rounded inputs' product
            assert torch.allclose(reference.double(), exact, atol=1e-4, rtol=1e-4)
            assert not torch.equal(reference, F.linear(x, weight, bias))  # the inputs were rounded
            for count in (1, 2, 3):  # 3: uneven shares, more threads than cores
                torch.set_num_threads(count)
                for rows in (2, 3, 4, 7, 11, 12, 13, 16, 25, 128, 130):
                    for first in (0, 1, 2):
                        block = x[first : first + rows]
                        assert torch.equal(linear(block), reference[first : first + len(block)]), (
                            rows,
                            first,
                        )
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("numerics", BF16_NUMERICS)
def test_the_bf16_dot_mode_leaves_float32_panels_and_odd_widths_to_the_float32_chains(numerics):
    generator = torch.Generator().manual_seed(12)
    wide = row_invariant.pack(torch.randn(40, 64, generator=generator))  # float32 values
    odd = row_invariant.pack(torch.randn(40, 33, generator=generator).bfloat16().float())  # k not even
    assert wide.panels.dtype == torch.float32 and odd.panels.dtype == torch.bfloat16
    for linear, width in ((wide, 64), (odd, 33)):
        x = torch.randn(9, width, generator=generator)
        with row_invariant.numerics_mode("float32"):
            expected = linear(x)
        with numerics_or_skip(numerics):
            assert torch.equal(linear(x), expected)


@pytest.mark.parametrize("out_features, in_features", [(576, 1536), (57, 64), (48, 32), (100, 320)])
def test_panels_in_amx_tile_order_give_the_bits_of_plain_panels(out_features, in_features):
    # 57 and 48 outputs: a last panel of 25 and 16 columns; rows 1-32 stream a panel, 40 and 130 take
    # the prefill path (two row tiles over the whole panel)
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16().float()
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(130, in_features, generator=generator)
    threads = torch.get_num_threads()
    try:
        with numerics_or_skip("amx"):
            plain = row_invariant.pack(weight, bias)
            ordered = row_invariant.pack(weight, bias, amx_order=True)
            assert ordered.panels.shape == (-(-out_features // 32), in_features // 32, 1024)
            for count in (1, 2):
                torch.set_num_threads(count)
                for rows in (1, 2, 3, 7, 16, 17, 32, 40, 130):
                    assert torch.equal(ordered(x[:rows]), plain(x[:rows])), (rows, count)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("numerics", ["float32", *BF16_NUMERICS])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("inputs, first_inputs", [(576, 320), (300, 160), (301, 151)])
def test_the_first_inputs_view_gives_the_bits_of_those_columns_packed_apart(
    numerics, bf16, inputs, first_inputs
):
    # 576 -> 320: an EAGLE head's fc_guess (fc's first 2 x hidden inputs; 2.5 k blocks; AMX tile
    # order under amx); 300 -> 160: plain bf16 panels under amx; 301 -> 151: odd, no pairs to dot
    generator = torch.Generator().manual_seed(33)
    weight = torch.randn(70, inputs, generator=generator)
    weight = weight.bfloat16().float() if bf16 else weight
    bias = torch.randn(70, generator=generator)
    x = torch.randn(40, first_inputs, generator=generator)
    with numerics_or_skip(numerics):
        whole = row_invariant.pack(weight, bias, bf16=bf16, amx_order=True)
        apart = row_invariant.pack(weight[:, :first_inputs], bias, bf16=bf16, amx_order=True)
        assert whole.splits_at(first_inputs)
        first = whole.first_inputs(first_inputs)
        assert first.panels.data_ptr() == whole.panels.data_ptr()  # a view: no second copy
        for rows in (1, 3, 16, 20, 40):  # 40: past the streamed tiles
            assert torch.equal(first(x[:rows]), apart(x[:rows])), rows
        with pytest.raises(ValueError, match="inputs"):
            whole.first_inputs(inputs + 1)
        if whole.panels.shape[2] != row_invariant.PANEL:  # AMX tile order splits at 32 inputs
            assert not whole.splits_at(300)
            with pytest.raises(ValueError, match="multiples of 32"):
                whole.first_inputs(300)


def test_amx_order_is_asked_only_where_it_applies_and_refused_under_other_numerics():
    generator = torch.Generator().manual_seed(21)
    weight = torch.randn(40, 64, generator=generator).bfloat16().float()
    odd = torch.randn(40, 48, generator=generator).bfloat16().float()  # k not a multiple of 32
    with numerics_or_skip("amx"):
        assert row_invariant.pack(odd, amx_order=True).panels.shape == (2, 48, 32)  # the usual layout
        assert row_invariant.pack(torch.randn(40, 64), amx_order=True).panels.dtype == torch.float32
        ordered = row_invariant.pack(weight, amx_order=True)
    with row_invariant.numerics_mode("float32"):
        assert row_invariant.pack(weight, amx_order=True).panels.shape == (2, 64, 32)
        with pytest.raises(RuntimeError, match="AMX tile order"):
            ordered(torch.randn(3, 64))


def test_other_weights_keep_float32_panels_and_bf16_panels_refuse_them():
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(10))
    assert row_invariant.pack(weight).panels.dtype == torch.float32
    with pytest.raises(RuntimeError, match="not bf16 values"):
        row_invariant.pack(weight, bf16=True)


def filled_cache(kv_heads: int, head_dim: int, positions: int, seed: int, dtype: torch.dtype = torch.float32):
    """A one-layer panel KV cache holding `positions` random keys and values, and those as [kv, n, d]."""
    from completion_engine.kv import KVCache

    generator = torch.Generator().manual_seed(seed)
    cache = KVCache(1, kv_heads, head_dim, positions, dtype, CPU, panels=True)
    keys, values = torch.randn(2, kv_heads, positions, head_dim, generator=generator)
    cache.write(0, 0, keys, values)
    return cache, keys, values


@pytest.fixture(params=["float32", "bfloat16-float32", "bfloat16-amx", "bfloat16-bf16dot"])
def cache_dtype(request) -> Iterator[torch.dtype]:
    """The KV cache's dtype: float32 (attention's fma chains), or bfloat16 as a bf16 checkpoint's runner
    keeps it: read by the fma chains, widened (the float32 numerics), or with bf16 products (the amx
    and bf16dot numerics: AMX tiles, or vdpbf16ps)."""
    if request.param == "float32":
        yield torch.float32
        return
    with numerics_or_skip(request.param.removeprefix("bfloat16-")):
        yield torch.bfloat16


@pytest.mark.parametrize("kv_heads, group, head_dim", [(3, 3, 64), (2, 1, 40), (1, 4, 16)])
def test_attention_values_are_those_of_softmax_attention(kv_heads, group, head_dim, cache_dtype):
    cache, keys, values = filled_cache(kv_heads, head_dim, 300, seed=head_dim, dtype=cache_dtype)
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(12, kv_heads * group, head_dim, generator=generator)
    lengths = torch.tensor([1, 2, 31, 32, 33, 100, 128, 129, 200, 255, 299, 300])
    got = row_invariant.attention(q, cache.keys[0], cache.values[0], lengths, head_dim**-0.5)
    assert got.shape == (12, kv_heads * group * head_dim)
    few = row_invariant.attention(
        q[3:8].contiguous(), cache.keys[0], cache.values[0], lengths[3:8], head_dim**-0.5
    )
    assert torch.equal(few, got[3:8])  # a step's passes, as the chunked pass
    # AMX: q, keys, values and probabilities in bf16 (8 bits of mantissa): the float32 maths' values
    # to about 1%; the keys and values are the cache's, rounded (a bf16 cache's in the float32 numerics too)
    bf16 = cache_dtype == torch.bfloat16 and row_invariant.numerics() != "float32"
    keys, values = keys.to(cache_dtype).float(), values.to(cache_dtype).float()
    for row, length in enumerate(lengths.tolist()):
        for head in range(kv_heads * group):
            kv = head // group
            weights = torch.softmax(q[row, head] @ keys[kv, :length].T * head_dim**-0.5, dim=-1)
            want = weights @ values[kv, :length]
            assert torch.allclose(
                got[row, head * head_dim : (head + 1) * head_dim],
                want,
                atol=2e-2 if bf16 else 1e-5,
                rtol=2e-2 if bf16 else 1e-4,
            )


@pytest.mark.parametrize("head_dim", [64, 40, 63])
def test_the_float32_numerics_read_a_bf16_cache_as_a_float32_one_holding_its_values(head_dim):
    # each key and value widened exactly: the bits of a float32 cache of the rounded values, for a
    # step, a verify block, a prefill block (the chunked pass) and a token tree; query heads per kv
    # head 1 to 3, so that a bf16 cache's half-panel tiles (4 or more slots a kv head, in tiles of up
    # to 6 as even as can be) come in every size, 3 to 6; with 512-bit tiles off, and on where the CPU
    # has them (they come first)
    kv_heads, size = 3, 700
    cache16, keys, values = filled_cache(kv_heads, head_dim, size, seed=21, dtype=torch.bfloat16)
    cache32, _, _ = filled_cache(kv_heads, head_dim, size, seed=21)
    cache32.write(0, 0, keys.bfloat16().float(), values.bfloat16().float())
    generator = torch.Generator().manual_seed(22)
    scale = head_dim**-0.5

    def equal_attention(
        q: torch.Tensor, lengths: torch.Tensor, tree: tuple[torch.Tensor, int] | None = None
    ) -> bool:
        got = row_invariant.attention(q, cache16.keys[0], cache16.values[0], lengths, scale, tree)
        want = row_invariant.attention(q, cache32.keys[0], cache32.values[0], lengths, scale, tree)
        return torch.equal(got, want)

    module = row_invariant.kernel()
    before = module.set_wide_tiles(False)
    try:
        with row_invariant.numerics_mode("float32"):
            for wide in (False, True) if "avx512f" in row_invariant.cpu_flags() else (False,):
                module.set_wide_tiles(wide)
                for group in (1, 2, 3):
                    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16, 128):
                        q = torch.randn(rows, kv_heads * group, head_dim, generator=generator)
                        lengths = torch.arange(size - rows + 1, size + 1) - torch.randint(
                            0, 40, (rows,), generator=generator
                        )
                        assert equal_attention(q, lengths), (wide, group, rows)
                    start = 600
                    q = torch.randn(6, kv_heads * group, head_dim, generator=generator)
                    lengths = torch.tensor([start + 1, start + 2, start + 2, start + 3, start + 4, start + 1])
                    tree = (torch.tensor([-1, 0, 0, 1, 3, -1]), start)
                    assert equal_attention(q, lengths, tree), (wide, group)
    finally:
        module.set_wide_tiles(before)


def test_the_bf16dot_numerics_keep_a_bf16_cache_only_for_an_even_head_dim():
    # vdpbf16ps multiplies pairs: an odd head_dim keeps the float32 cache and its fma chains
    with numerics_or_skip("bf16dot"):
        assert row_invariant.cache_dtype(True, 64) == torch.bfloat16
        assert row_invariant.cache_dtype(True, 63) == torch.float32
        assert row_invariant.cache_dtype(False, 64) == torch.float32  # float32 panels
        odd = torch.zeros(1, 2, 63, 32, dtype=torch.bfloat16), torch.zeros(1, 2, 64, 32, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="even head_dim"):
            row_invariant.attention(torch.randn(1, 1, 63), *odd, torch.tensor([9]), 0.125)
    with numerics_or_skip("float32"):  # the fma chains read a bf16 cache widened, any head_dim
        assert row_invariant.cache_dtype(True, 64) == torch.bfloat16
        assert row_invariant.cache_dtype(True, 63) == torch.bfloat16
        assert row_invariant.cache_dtype(False, 64) == torch.float32


def test_the_amx_numerics_keep_a_bf16_cache_for_an_odd_head_dim_too():
    # AMX tiles pad head_dim to blocks of 32: an odd one is read as the even ones are
    with numerics_or_skip("amx"):
        assert row_invariant.cache_dtype(True, 63) == torch.bfloat16
        cache, keys, values = filled_cache(1, 63, 64, seed=4, dtype=torch.bfloat16)
        q = torch.randn(2, 1, 63, generator=torch.Generator().manual_seed(5))
        got = row_invariant.attention(q, cache.keys[0], cache.values[0], torch.tensor([9, 40]), 0.125)
        for row, length in enumerate((9, 40)):
            keys16, values16 = keys[0, :length].bfloat16().float(), values[0, :length].bfloat16().float()
            want = torch.softmax(q[row, 0] @ keys16.T * 0.125, dim=-1) @ values16
            assert torch.allclose(got[row], want, atol=2e-2, rtol=2e-2)


def test_attention_of_no_rows_is_empty():
    cache, _, _ = filled_cache(3, 64, 64, seed=4)
    got = row_invariant.attention(
        torch.zeros(0, 9, 64), cache.keys[0], cache.values[0], torch.zeros(0, dtype=torch.long), 0.125
    )
    assert got.shape == (0, 9 * 64)


def test_attention_gives_a_row_the_same_bits_alone_in_any_company_and_thread_count(cache_dtype):
    cache, _, _ = filled_cache(3, 64, 512, seed=2, dtype=cache_dtype)
    q = torch.randn(40, 9, 64, generator=torch.Generator().manual_seed(3))
    lengths = torch.arange(400, 440)  # 40 causal rows, across a panel boundary
    together = row_invariant.attention(q, cache.keys[0], cache.values[0], lengths, 0.125)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):  # 3: uneven shares, more threads than cores
            torch.set_num_threads(count)
            alone = [
                row_invariant.attention(
                    q[i : i + 1].contiguous(), cache.keys[0], cache.values[0], lengths[i : i + 1], 0.125
                )
                for i in range(40)
            ]
            assert torch.equal(torch.cat(alone), together)
            # a step's and a verify block's row counts: the passes they take, and (3 heads a row on
            # a kv head) their row tiles: 6 and 15 slots (one tile), 18 (16 + 2), 24 (16 + 8),
            # 33 (16 + 16 + 1), 39 (16 + 16 + 7)
            for size in (2, 5, 6, 8, 11, 13):
                parts = [
                    row_invariant.attention(
                        q[i : i + size].contiguous(),
                        cache.keys[0],
                        cache.values[0],
                        lengths[i : i + size],
                        0.125,
                    )
                    for i in range(0, 40, size)
                ]
                assert torch.equal(torch.cat(parts), together)
            reversed_rows = row_invariant.attention(
                q.flip(0).contiguous(), cache.keys[0], cache.values[0], lengths.flip(0), 0.125
            )
            assert torch.equal(reversed_rows.flip(0), together)
    finally:
        torch.set_num_threads(threads)


def test_attention_never_reads_past_a_rows_own_keys(cache_dtype):
    # rows of very different lengths share the kernel's tiles; everything past the longest is NaN
    cache, _, _ = filled_cache(3, 64, 512, seed=6, dtype=cache_dtype)
    cache.keys[0, :, 300 // 32 :] = float("nan")  # panels from 288 on; refill 288..299 below
    cache.values[0, :, :, 288:] = float("nan")
    keys, values = torch.randn(2, 3, 12, 64, generator=torch.Generator().manual_seed(7))
    cache.write(0, 288, keys, values)  # positions 288..299 valid again, 300.. NaN
    q = torch.randn(9, 9, 64, generator=torch.Generator().manual_seed(8))
    lengths = torch.tensor([300, 1, 150, 33, 299, 2, 64, 65, 200])
    together = row_invariant.attention(q, cache.keys[0], cache.values[0], lengths, 0.125)
    assert not torch.isnan(together).any()
    alone = [
        row_invariant.attention(
            q[i : i + 1].contiguous(), cache.keys[0], cache.values[0], lengths[i : i + 1], 0.125
        )
        for i in range(9)
    ]
    assert torch.equal(torch.cat(alone), together)
    few = row_invariant.attention(q[:8].contiguous(), cache.keys[0], cache.values[0], lengths[:8], 0.125)
    assert torch.equal(few, together[:8])  # a small block's passes: keys read in blocks of 256


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 3.4e38])  # 3.4e38: Inf once rounded to bf16
def test_a_value_that_is_not_finite_past_a_rows_length_never_reaches_it(cache_dtype, bad):
    # a longer row's value (a diverged model's, say) lies within the keys a shorter row's chain runs
    # over beside it: the shorter row keeps the bits it gets alone
    cache, _, _ = filled_cache(3, 64, 512, seed=15, dtype=cache_dtype)
    cache.values[0, :, :, 459] = bad  # position 459: seen by the last of 40 causal rows only
    q = torch.randn(40, 9, 64, generator=torch.Generator().manual_seed(16))
    lengths = torch.arange(421, 461)  # a block of more than 16 rows (prefill items), and steps
    for rows in (40, 2, 16):
        together = row_invariant.attention(
            q[-rows:].contiguous(), cache.keys[0], cache.values[0], lengths[-rows:], 0.125
        )
        alone = [
            row_invariant.attention(
                q[i : i + 1].contiguous(), cache.keys[0], cache.values[0], lengths[i : i + 1], 0.125
            )
            for i in range(40 - rows, 39)
        ]
        assert not torch.isnan(torch.cat(alone)).any()
        assert torch.equal(together[:-1], torch.cat(alone)), rows


@pytest.mark.skipif("avx512f" not in row_invariant.cpu_flags(), reason="the CPU has no AVX-512")
def test_attention_on_512_bit_tiles_gives_the_bits_of_256_bit_ones():
    # scores and outputs in tiles of up to 12 query slots (512-bit) or 3 (AVX2): the same chains
    module = row_invariant.kernel()
    cache, _, _ = filled_cache(3, 64, 700, seed=13)
    q = torch.randn(30, 9, 64, generator=torch.Generator().manual_seed(14))
    lengths = torch.tensor([650 + i * (i % 3) for i in range(30)])  # uneven: slots of a tile end apart
    parents = torch.tensor([-1, 0, 1, 1, 0, 4, 5, 2])
    threads, before = torch.get_num_threads(), module.set_wide_tiles(True)
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (
                1,
                2,
                4,
                8,
                9,
                16,
                17,
                30,
            ):  # a step's and a verify block's passes, chunks of 12 and 24
                results = []
                for wide in (True, False):
                    module.set_wide_tiles(wide)
                    results.append(
                        module.attention(
                            q[:rows].contiguous(),
                            cache.keys[0],
                            cache.values[0],
                            lengths[:rows],
                            0.125,
                            None,
                            0,
                        )
                    )
                assert torch.equal(*results), (rows, count)
            tree_lengths = torch.tensor([600, 601, 602, 602, 601, 602, 603, 603])  # start + depth + 1
            results = []
            for wide in (True, False):
                module.set_wide_tiles(wide)
                results.append(
                    module.attention(
                        q[:8].contiguous(), cache.keys[0], cache.values[0], tree_lengths, 0.125, parents, 599
                    )
                )
            assert torch.equal(*results), count
    finally:
        module.set_wide_tiles(before)
        torch.set_num_threads(threads)


TREES = [
    [-1],  # the root alone
    [-1, 0, 1, 2, 3],  # a chain
    [-1, 0, 0, 0, 1, 2, 3, 1, 5, 4, 9],  # wide and deep
    [-1, 0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14],  # 16 nodes: two long branches
    [-1, -1, 0, 1, -1, 2, 4, 6],  # a forest: three roots (a draft head's levels under one token)
]


@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize("start", [0, 1, 31, 300])
@pytest.mark.parametrize("kv_heads, group, head_dim", [(3, 3, 64), (1, 4, 40), (1, 17, 16)])  # 17: > a tile
def test_a_tree_node_gets_the_bits_of_its_path_decoded_as_a_chain(
    parents, start, kv_heads, group, head_dim, cache_dtype
):
    # node i's keys and values sit at start + i; its path's would sit at start, start + 1, ... in a chain
    n, size = len(parents), start + len(parents) + 1  # one position more: NaN, never read
    cache, _, _ = filled_cache(kv_heads, head_dim, size, seed=11, dtype=cache_dtype)
    generator = torch.Generator().manual_seed(12)
    node_keys, node_values = torch.randn(2, kv_heads, n, head_dim, generator=generator)
    nan = torch.full_like(node_keys[:, :1], float("nan"))
    cache.write(0, start, node_keys, node_values)
    cache.write(0, start + n, nan, nan)
    q = torch.randn(n, kv_heads * group, head_dim, generator=generator)
    paths = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [node])
    lengths = torch.tensor([start + len(path) for path in paths])
    threads = torch.get_num_threads()
    try:
        trees = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            trees.append(
                row_invariant.attention(
                    q, cache.keys[0], cache.values[0], lengths, 0.125, (torch.tensor(parents), start)
                )
            )
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(tree, trees[0]) for tree in trees)
    for node, path in enumerate(paths):
        chain, _, _ = filled_cache(kv_heads, head_dim, size, seed=11, dtype=cache_dtype)  # the same prefix
        chain.write(0, start, node_keys[:, path], node_values[:, path])
        chain.write(0, start + len(path), nan, nan)  # past the path: never read
        alone = row_invariant.attention(
            q[node : node + 1].contiguous(), chain.keys[0], chain.values[0], lengths[node : node + 1], 0.125
        )
        assert torch.equal(trees[0][node : node + 1], alone), (node, path)


@pytest.mark.parametrize("parents", TREES[1:])
@pytest.mark.parametrize("asked", [1, 3])
def test_the_last_nodes_of_a_tree_asked_alone_get_the_bits_they_get_among_all(parents, asked, cache_dtype):
    """A call may ask for the last nodes only (a draft head adds a level to the nodes it computed)."""
    start, kv_heads, group, head_dim = 40, 3, 3, 64
    n = len(parents)
    cache, _, _ = filled_cache(kv_heads, head_dim, start + n + 1, seed=14, dtype=cache_dtype)
    generator = torch.Generator().manual_seed(15)
    cache.write(0, start, *torch.randn(2, kv_heads, n, head_dim, generator=generator))
    nan = torch.full((kv_heads, 1, head_dim), float("nan"))
    cache.write(0, start + n, nan, nan)  # past the nodes: never read
    q = torch.randn(n, kv_heads * group, head_dim, generator=generator)
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    lengths = torch.tensor([start + depth for depth in depths])
    tree = (torch.tensor(parents), start)
    every = row_invariant.attention(q, cache.keys[0], cache.values[0], lengths, 0.125, tree)
    last = row_invariant.attention(
        q[-asked:].contiguous(), cache.keys[0], cache.values[0], lengths[-asked:], 0.125, tree
    )
    assert torch.equal(every[-asked:], last)


@pytest.mark.parametrize(
    "lengths, parents, start, message",
    [
        ([11, 12, 12], [-1, 2, 0], 10, "parents"),  # a child before its parent
        ([11, 12, 13], [-1, 0, 0], 10, "depth"),  # node 2 is at depth 1, not 2
        ([127, 128, 128], [-1, 0, 0], 126, "does not hold the tree"),  # node 2 would sit at 128
        ([11, 12, 12], [-1, 0], 10, "nodes >= rows"),  # fewer nodes than rows
    ],
)
def test_a_tree_with_wrong_parents_or_lengths_is_a_clear_error(lengths, parents, start, message):
    cache, _, _ = filled_cache(1, 16, 64, seed=13)
    assert cache.capacity == 128
    with pytest.raises(RuntimeError, match=message):
        row_invariant.attention(
            torch.randn(3, 1, 16),
            cache.keys[0],
            cache.values[0],
            torch.tensor(lengths),
            0.25,
            (torch.tensor(parents), start),
        )


def test_attention_keeps_a_nan_score_nan():
    cache, _, _ = filled_cache(1, 16, 128, seed=9)
    q = torch.full((1, 1, 16), float("nan"))
    assert torch.isnan(
        row_invariant.attention(q, cache.keys[0], cache.values[0], torch.tensor([5]), 0.25)
    ).all()


def test_attention_refuses_lengths_outside_the_cache():
    cache, _, _ = filled_cache(1, 16, 128, seed=4)
    q = torch.randn(1, 1, 16)
    for bad in (0, 129):
        with pytest.raises(RuntimeError, match="length is out of range"):
            row_invariant.attention(q, cache.keys[0], cache.values[0], torch.tensor([bad]), 0.25)


def test_a_bf16_checkpoint_in_float32_runs_on_bf16_panels(tiny_target_fp32_bf16_valued, tiny_target_fp32):
    narrow = DecoderRunner(tiny_target_fp32_bf16_valued.weights, exact=True, capacity=256)
    wide = DecoderRunner(tiny_target_fp32.weights, exact=True, capacity=256)
    assert narrow.linears[0].qkv.panels.dtype == narrow.lm_head.panels.dtype == torch.bfloat16
    assert wide.linears[0].qkv.panels.dtype == torch.float32


def rows_alone_and_together(fn, *row_inputs: torch.Tensor) -> None:
    """fn on all rows equals fn row by row, bit for bit, on one and two threads."""
    together = fn(*row_inputs)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):  # 3: uneven shares, more threads than cores
            torch.set_num_threads(count)
            for i in range(row_inputs[0].shape[0]):
                alone = fn(*(t[i : i + 1].contiguous() for t in row_inputs))
                parts = alone if isinstance(alone, (tuple, list)) else (alone,)
                whole = together if isinstance(together, (tuple, list)) else (together,)
                for a, b in zip(parts, whole, strict=True):
                    assert torch.equal(a[0], b[i]), f"row {i} on {count} threads"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("width", [576, 37, 8])
def test_rms_norm_values_and_row_bits(width):
    from completion_engine.runner import rms_norm

    generator = torch.Generator().manual_seed(width)
    x, weight = torch.randn(20, width, generator=generator), torch.randn(width, generator=generator)
    got = row_invariant.rms_norm(x, weight, 1e-5)
    assert torch.allclose(got, rms_norm(x, weight, 1e-5), atol=1e-5, rtol=1e-5)
    rows_alone_and_together(lambda rows: row_invariant.rms_norm(rows, weight, 1e-5), x)


def test_rotary_values_and_row_bits():
    from completion_engine.runner import rotate_half

    generator = torch.Generator().manual_seed(11)
    heads, kv_heads, d = 9, 3, 64
    qkv = torch.randn(20, (heads + 2 * kv_heads) * d, generator=generator)
    cos, sin = torch.randn(2, 20, d, generator=generator)
    q, k = row_invariant.rotary(qkv, heads, kv_heads, cos, sin)
    q_in = qkv[:, : heads * d].view(20, heads, d)
    k_in = qkv[:, heads * d : (heads + kv_heads) * d].view(20, kv_heads, d)
    for got, x in ((q, q_in), (k, k_in)):
        want = x * cos[:, None] + rotate_half(x) * sin[:, None]
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    rows_alone_and_together(lambda a, c, s: row_invariant.rotary(a, heads, kv_heads, c, s), qkv, cos, sin)


@pytest.mark.parametrize("width", [1536, 13])
def test_silu_mul_values_and_row_bits(width):
    generator = torch.Generator().manual_seed(width)
    gate_up = torch.randn(20, 2 * width, generator=generator) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    got = row_invariant.silu_mul(gate_up)
    assert torch.allclose(got, F.silu(gate) * up, atol=1e-5, rtol=1e-5)
    rows_alone_and_together(row_invariant.silu_mul, gate_up)


def test_exact_float32_runners_attend_on_the_kernel(tiny_target_fp32):
    runner = DecoderRunner(tiny_target_fp32.weights, exact=True, capacity=256)
    fast = DecoderRunner(tiny_target_fp32.weights, exact=False, capacity=256)
    assert runner.cache.panels and not fast.cache.panels  # fast mode attends with SDPA


def test_the_kernel_lets_other_python_threads_run():
    """It releases the GIL as torch's ops do: a language server's event loop must not stall on it."""
    import threading
    import time

    linear = row_invariant.pack(torch.randn(8192, 1024))
    x = torch.randn(256, 1024)  # one call of some 50 ms
    seen: list[float] = []  # when the other thread ran
    running, done = threading.Event(), threading.Event()

    def other() -> None:
        running.set()
        while not done.is_set():
            seen.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert running.wait(timeout=10)
        started = time.perf_counter()
        linear(x)
        ended = time.perf_counter()
    finally:
        done.set()
        thread.join(timeout=10)
    # holding the GIL, the call would leave the other thread no turn in its middle half
    quarter = (ended - started) / 4
    assert any(started + quarter < t < ended - quarter for t in seen), (ended - started, len(seen))


def test_a_layer_refuses_a_tree_of_fewer_nodes_than_rows_before_writing_the_cache():
    from completion_engine.kv import KVCache

    g = torch.Generator().manual_seed(10)
    hidden, heads, kv_heads, d, n, start = 32, 2, 1, 32, 3, 4
    linears = [
        row_invariant.pack(torch.randn(o, i, generator=g) / 8)
        for o, i in (((heads + 2 * kv_heads) * d, hidden), (hidden, heads * d), (64, hidden), (hidden, 32))
    ]
    cache = KVCache(1, kv_heads, d, 128, torch.float32, CPU, panels=True)
    before = cache.keys.clone(), cache.values.clone()
    ones = torch.ones(hidden)
    with pytest.raises(RuntimeError, match="nodes >= rows"):
        row_invariant.layer(
            torch.randn(n, hidden, generator=g),
            (ones, ones),
            1e-5,
            row_invariant.LayerPanels.of(tuple(linears)),
            (torch.ones(n, d), torch.zeros(n, d)),
            (heads, kv_heads),
            (cache.keys[0], cache.values[0]),
            start,
            torch.tensor([start + 1, start + 2, start + 3]),
            d**-0.5,
            (0, n),
            torch.tensor([-1, 0]),  # two nodes for three rows: they would be written before `start`
        )
    assert torch.equal(cache.keys, before[0]) and torch.equal(cache.values, before[1])


@pytest.mark.parametrize("rows", [(0, 5), (4, 5), (5, 5)])
def test_a_layer_in_one_call_has_the_bits_of_its_steps_one_by_one(rows):
    """row_invariant.layer against rms_norm, the Linears, rotary, the cache write, attention, silu_mul
    and the residual adds called one by one: the same output rows and the same cache, bit for bit."""
    from completion_engine.kv import KVCache

    g = torch.Generator().manual_seed(9)
    hidden, heads, kv_heads, d, inner, n, start = 48, 6, 2, 40, 80, 5, 37  # d 40: values pad to 2 panels
    qkv = row_invariant.pack(
        torch.randn((heads + 2 * kv_heads) * d, hidden, generator=g) / 8,
        torch.randn((heads + 2 * kv_heads) * d, generator=g),
    )
    out, gate_up, down = (
        row_invariant.pack(torch.randn(o, i, generator=g) / 8)
        for o, i in ((hidden, heads * d), (2 * inner, hidden), (hidden, inner))
    )
    norms = (torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5)
    x = torch.randn(n, hidden, generator=g)
    angles = torch.rand(n, d, generator=g) * 6
    cos, sin = angles.cos(), angles.sin()
    lengths = torch.arange(start + 1, start + n + 1)
    caches = [KVCache(1, kv_heads, d, 128, torch.float32, CPU, panels=True) for _ in range(2)]
    earlier = torch.randn(2, kv_heads, start, d, generator=g)
    for cache in caches:
        cache.write(0, 0, *earlier)

    one_call = row_invariant.layer(
        x,
        norms,
        1e-5,
        row_invariant.LayerPanels.of((qkv, out, gate_up, down)),
        (cos, sin),
        (heads, kv_heads),
        (caches[0].keys[0], caches[0].values[0]),
        start,
        lengths,
        d**-0.5,
        rows,
    )

    projected = qkv(row_invariant.rms_norm(x, norms[0], 1e-5))
    q, k = row_invariant.rotary(projected, heads, kv_heads, cos, sin)
    v = projected[:, (heads + kv_heads) * d :].reshape(n, kv_heads, d)
    caches[1].write(0, start, k.transpose(0, 1), v.transpose(0, 1))
    first, end = rows
    attended = row_invariant.attention(
        q[first:end].contiguous(), caches[1].keys[0], caches[1].values[0], lengths[first:end], d**-0.5
    )
    h = x[first:end] + out(attended)
    steps = h + down(row_invariant.silu_mul(gate_up(row_invariant.rms_norm(h, norms[1], 1e-5))))

    assert one_call.shape == (end - first, hidden) and torch.equal(one_call, steps)
    assert torch.equal(caches[0].keys, caches[1].keys) and torch.equal(caches[0].values, caches[1].values)
