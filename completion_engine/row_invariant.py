"""A float32 CPU linear that gives a row the same bits whatever the rows beside it, faster than MKL's.

Why: the exact runner needs a position's hidden state to be a pure function of its tokens, so every
Linear must give a row the same bits in a 1-token decode step, a 16-row verify block and a 128-row
prefill block. MKL does not: it runs a GEMV for 1 row and picks other GEMM kernels by row count, so
on an AVX2 CPU in float32 the runner had to pad decode forwards to at least 4 rows, and a 4-row
GEMM costs about twice a 1-row GEMV there. This kernel (kernels/row_invariant_linear.cpp) computes
every output as one fixed chain of fused multiply-adds over k, in order, from zero, for any row
count, row position, thread count and blocking, so no padding is needed at all.

Measured against torch's F.linear (MKL) on the 30 layers' four Linears of SmolLM2-135M on an AMD
EPYC (AVX2, no AVX-512), float32, best of 15, ms:

    rows              1     4    11    16   128
    MKL, 1 thread    29    54    81    81   332
    ours, 1 thread   22    30    45    55   311
    MKL, 2 threads   29    57    55    56   192
    ours, 2 threads  13    17    25    31   158

How: each weight is packed once into panels of 32 output columns ([ceil(N / 32), K, 32], zero
padded), so a panel streams through memory once per call; the micro-kernel keeps 3 rows x 32
columns of chains in 12 AVX2 registers and walks k in blocks of 128 (16 KiB of panel, in L1);
threads split the panels (torch's own OpenMP pool): in a prefill block (more than 16 rows, compute-bound)
they take panels, and attention their query chunks, one at a time, so that a core slowed by the
host's other work takes fewer rather than the other spinning at the end for its fixed share. A cold
2,136-token prefill (`eval.step_timing.embedded_float32`), two threads, fixed shares and claimed
items alternating in one process (two builds of this file), 8 rounds each, two runs: best 5.29 ->
4.90 s and 4.82 -> 4.20 s, median 5.76 -> 5.32 s and 5.68 -> 5.04 s; one-row steps unchanged. In a
step or verify block (memory-bound) each thread streams one contiguous share, which the hardware
prefetcher follows (claimed one at a time, steps measured slower). Where every weight is a bf16 value (a bf16
checkpoint loaded in float32, the common case) the panels are kept in bf16 and widened to the very
same float32 values as they are read: the same chains and bits, half the bytes. Against 4 to 16
rows (a verify block) bf16 panels run tiles of up to 6 rows x half a panel (12 accumulators beside
2 widened weight vectors), so each weight is widened once per tile in registers; more rows widen
each 16 KiB block once into an aligned L1 buffer. A decode step reads
every weight once, so it runs at memory speed: at a 2,000-token context a step of SmolLM2-135M took
29.4 ms against 41.3 ms with float32 panels, a verify block of 11 tokens 110 against 115 ms, a
prefill 8.61 against 8.53 s (one thread, `python -m eval.bench_panels`).
The packed copy adds half the memory of the float32 weights (all of it with float32 panels).

Where the CPU has AVX-512 (checked at run time; one build, the rest AVX2), 2 to 16 rows (a verify
block) run 512-bit tiles of up to 12 rows x a whole panel: a weight is widened once per 12 rows
instead of once per 3 (whole panels) or 6 (half panels, each x value broadcast twice), and 3 rows no longer
spill AVX2's 16 registers. The same chains, so the same bits (`set_wide_tiles` turns them off to
compare; test_row_invariant.py checks it). Measured on an AMD EPYC (Zen 4, 2 cores, shared): the 30
layers' Linears and the LM head with bf16 panels, 256-bit and 512-bit tiles interleaved in one
process, best of 7, ms:

    rows              1     2     3     4     8    11    16
    1 thread, 256  12.7  15.9  22.4  25.0  42.8  50.7  64.8
    1 thread, 512  12.7  15.0  17.9  21.1  29.9  38.9  57.4
    2 threads, 256  7.4   9.4  12.4  13.9  22.7  26.6  33.8
    2 threads, 512  7.6   8.6  10.3  11.7  16.4  21.0  29.8

and the whole forward at a 2,000-token context (`python -m eval.bench_forward --threads 1`, with
SPEC_COMPLETE_ROW_KERNEL=avx2 and without, alternating, two rounds): a verify block of 11 tokens
75.2 and 82.4 -> 60.5 and 62.8 ms, a 1-row step 16.3 and 19.1 -> 16.4 and 16.6 ms. Prefill blocks
(128 rows) keep the 3-row tiles: compute-bound there, 512-bit tiles ran no faster (128 rows: 357.9
against 356.0 ms on one thread, 179.9 against 182.0 on two).

Where the CPU has AVX512-BF16 (AMD Zen 4 and later, Intel Xeon from Cooper Lake and Sapphire Rapids
on), Linears over bf16 panels run in the bf16 dot mode: each input row is rounded to bf16 (to
nearest even, as torch's `.to(torch.bfloat16)`) and an output is one fixed chain of `vdpbf16ps`
steps over pairs of k, from zero, each adding x[k] w[k] and x[k + 1] w[k + 1] in the instruction's
own order and rounding (denormals flushed). A row's chain never
depends on the rows beside it, so every invariance above holds (tested as for the float32 chains);
what changes is the model's numbers: the inputs of its Linears are rounded to bf16, as in a bf16
forward (torch's, HF's), while the residual stream, norms and attention's arithmetic stay float32.
Twice the multiply-adds an instruction and no widening: measured in one process, interleaved, the
30 layers' Linears and the LM head of SmolLM2-135M with random bf16 weights, one thread, beside a
training run (best of 5, ms; `/tmp` script):

    rows              1     2     4     8    16   128
    float32 inputs  18.7  13.5  19.6  28.1  63.4  525
    bf16 dot        15.5  11.3  12.0  16.8  38.4  315

SPEC_COMPLETE_ROW_KERNEL=float32 keeps float32 inputs (the bits of CPUs without AVX512-BF16; since
session 44 a bf16 checkpoint's KV cache is bf16 there too, so not those of earlier releases);
`numerics_mode` switches it for a block (tests, `eval.bench_forward`).

Where the CPU also has AMX-BF16 (Intel Xeon from Sapphire Rapids on) the dot mode multiplies on AMX
tiles: the bf16 input rows zero-padded to tiles of 16 rows x 32 k, a panel's pairs of k interleaved
into two 16-column tiles per block of 32 k (just before their products where a call has up to 32
rows, so the panel streams from memory meanwhile), each output one fixed chain of `tdpbf16ps` steps
over the blocks from zero; a call of fewer than 16 rows configures its tiles that high, so a 1-row
step multiplies one row, not 16. A row's outputs come from its own input row alone, in a tile of any
height, so every invariance holds (tested as above); the bits are AMX's own, neither vdpbf16ps's nor
the fma chains'. Measured on a 2-core Intel Xeon (AMX) VM, the 30 layers' Linears and the LM head of
SmolLM2-135M with random bf16 weights, vdpbf16ps and AMX in one process, best of 5, ms (`/tmp` script):

    rows                1     2     4     8    11    16   128
    2 threads, bf16dot 7.5   7.9  10.3  15.5  19.2  26.2   199
    2 threads, amx     7.9   7.8   7.9   8.3   8.9   9.5  43.5
    1 thread, bf16dot 13.7  14.0  18.0  27.5  34.2  48.3   393
    1 thread, amx     14.4  13.7  14.1  14.9  15.6  16.5  58.9

so a verify block's rows cost almost nothing beside streaming the weights, and prefill blocks run
4-7x faster (SPEC_COMPLETE_ROW_KERNEL=dot keeps vdpbf16ps).
The numerics in force: `numerics()` ("float32", "bf16dot", "amx").

Attention (`attention`) runs on the same micro-kernel over the KV cache's panel layout: scores are
fixed chains over head_dim, the softmax is the kernel's own, outputs are fixed chains over the keys;
fused in one call per layer, a 2,136-token prefill's attention took 1.42 s against 2.06 s for
per-head calls of `linear` with torch's softmax between them (2 threads; cProfile of a cold request).
Where the CPU has AVX-512, scores and outputs run the 512-bit tiles of up to 12 query slots (a row's
head) x 32 keys or value columns, as the Linears' verify tiles: the same chains, so the same bits
(tested against the AVX2 tiles). The whole forward at a 2,000-token context on an Intel Xeon (AMX
numerics), 512-bit and AVX2 tiles interleaved in one process, best of 7 (`/tmp` script): a verify
block of 11 tokens 35.1 -> 31.8 ms on two threads, 58.6 -> 52.5 on one; 4 tokens 23.6 -> 22.8 and
41.9 -> 40.3; a step unchanged (20.3, 35.4); a cold 2,000-token prefill 1.54 -> 1.24 s (two threads,
best of 4, alternating; `/tmp` script).
In the amx numerics (Linears over bf16 panels on AMX) the runner keeps a bfloat16 cache
(`cache_dtype`) and attention runs on AMX tiles too: q and the probabilities rounded to bf16, each
score a tdpbf16ps chain over head_dim, each output one over the keys in blocks of 32 from position 0
(a row's probabilities are zero past its length, so a chain that runs on past its last block adds
exact zeros: still row-invariant, tested as above, trees included); the softmax on 16 lanes; prefill
blocks in items of 32 slots whose score rows stay in L2. Half the bytes to read in a step, and the
multiplies of a verify block almost free. 30 layers' attention at 2,000 keys, two threads, best of 7
(`/tmp` script; a float32 cache against a bf16 one, one process): rows 1 / 4 / 11 / 16 / 128:
4.33 / 5.58 / 12.1 / 14.9 / 82.8 ms on the fma chains, 1.57 / 2.36 / 5.30 / 6.25 / 38.4 on AMX.
In the bf16dot numerics (vdpbf16ps, no AMX) the runner keeps a bfloat16 cache too, where head_dim is
even (session 37): q and the probabilities rounded to bf16 likewise, each score a chain of vdpbf16ps
over head_dim in pairs, each output one over the keys in pairs from position 0 (the keys every row
holds together, then each row's own rest alone, gathered and zero past its length: the split never
changes a chain); the same softmax. Same measurement on a 2-core AMD EPYC Zen 4, a float32 cache's
fma chains against a bf16 cache's vdpbf16ps, one process, interleaved (`/tmp` script), rows 1 / 4 /
11 / 16 / 128: 3.77 / 5.36 / 12.0 / 16.2 / 111 ms against 2.15 / 3.15 / 7.26 / 9.27 / 60.0 on two
threads; 6.36 / 9.89 / 20.9 / 29.2 / 216 against 2.82 / 5.19 / 13.4 / 17.9 / 119 on one.
In the float32 numerics a bf16 checkpoint's runner keeps a bfloat16 cache as well (session 44): the
fma chains read each key and value widened exactly (a bf16 value is the top half of a float32), so
a row gets the bits a float32 cache holding the rounded values gives it, and a decode step streams
half the cache. On 2 cores of an AMD EPYC with AVX2 (Zen 3), two threads, a float32 cache against a
bf16 one of the same values in one process (`/tmp` scripts): 30 layers' attention at 2,000 keys,
rows 1 / 2 / 4 / 8 / 16 / 128: 3.97 / 4.28 / 6.48 / 11.9 / 19.2 / 126 ms against 2.10 / 3.07 / 5.59 /
11.0 / 19.9 / 143; the whole forward after 1,950 tokens, a step 13.9 -> 12.5 ms and 2 rows 13.7 ->
12.8 (4-16 rows level), a cold 2,000-token prefill 5.2 -> 4.8 s (4 runs each, noisy: no slower).
Greedy decoding then follows slightly different numerics: on one `email` prompt the two caches
gave the same first 58 tokens of 64.

The small steps of a layer (`rms_norm`, `rotary`, `silu_mul`) are kernel calls too, each a fixed
function of its own row: about 25 torch ops a layer became three calls (per layer and 1 row, some
250 us of dispatch against 25 us). For a chain of tokens (decode steps, verify blocks, prefill
blocks) `layer` runs a whole decoder layer, cache write included, in one call: the same steps in the
same order in C++, so the same bits, and no Python between them (a 1-row step after 2,000 tokens,
two threads: 22 -> 17 ms, the other core no longer waiting on the glue; one thread: no change).
Token trees take it too (`parents`: the nodes attend as `attention` says).

The kernel is compiled on first use with torch's C++ extension loader (a C++ compiler and the Python
headers; about 30 s, once, cached in $SPEC_COMPLETE_CACHE/kernels, by default ~/.cache/spec-complete;
a build stopped midway is redone by the next load: `build_lock`). Where it cannot be built, the CPU
lacks AVX2 and FMA, the dtype is not float32 or the device not a CPU, the runner keeps
torch's kernels and its probed row buckets. SPEC_COMPLETE_ROW_KERNEL=0 turns it off; =avx2 keeps
verify blocks on 256-bit tiles where the CPU has AVX-512 (the same bits, slower: to compare) and
float32 inputs; =float32 keeps float32 inputs only; =dot multiplies bf16 inputs with vdpbf16ps where the
CPU has AMX too.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from completion_engine.embedded import cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "kernels" / "row_invariant_linear.cpp"
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
BUILD_WAIT_S = 600.0  # another process's first build takes 30-60 s; ten minutes means it is stuck

_lock = threading.Lock()
_built: dict[str, ModuleType | None] = {}


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from Linux's /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_multiplies_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (x86 AMX-BF16 or AVX512-BF16; Linux's cpuinfo flags)."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def enabled() -> bool:
    return os.environ.get("SPEC_COMPLETE_ROW_KERNEL", "1") not in ("0", "off", "false", "no")


def kernel() -> ModuleType | None:
    """The compiled extension, building it on first call; None where it cannot run here (logged once)."""
    with _lock:
        if "module" not in _built:
            _built["module"] = _build()
        return _built["module"]


def build_directory() -> Path:
    """Where the compiled extension is cached: one folder per torch version, in the embedded model's cache.

    Builds here take `build_lock`; the name is new with it, so that no older copy of this module,
    which took no such lock, ever builds in the same folder.
    """
    version = torch.__version__.replace("+", "_")
    return cache_root() / "kernels" / f"torch-{version}-locked"


@contextmanager
def build_lock(directory: Path, wait_s: float = BUILD_WAIT_S) -> Iterator[bool]:
    """Holds an flock on directory/build.flock while this process builds or loads the extension.

    Yields False (holding nothing) if another process held it for wait_s. Why: torch's loader marks a
    build with a file named `lock` and removes it when done, so a process stopped mid-build (Ctrl-C, a
    killed job) leaves it behind and every later load waits on it forever. The OS releases an flock
    when its holder dies, and every build in this folder takes this one before torch's, so a `lock`
    found under it was left by a process that is gone: it is removed. (A compiler that outlived its
    killed Python process may still be writing; the next load's build then redoes its output.)
    """
    import fcntl  # POSIX only, as is the kernel (x86-64 Linux)

    with open(directory / "build.flock", "a") as handle:
        deadline = time.monotonic() + wait_s
        held = waiting = False
        while not held:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                if not waiting:
                    logger.info("row-invariant float32 kernel: waiting for another process's build")
                    waiting = True
                time.sleep(0.1)
        if not held:
            yield False
            return
        try:
            stale = directory / "lock"
            if stale.exists():
                logger.warning("row-invariant float32 kernel: removed %s, left by a stopped build", stale)
                stale.unlink(missing_ok=True)
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build() -> ModuleType | None:
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= cpu_flags():
        logger.info("row-invariant float32 kernel: this CPU lacks AVX2/FMA; using torch's kernels")
        return None
    try:
        directory = build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        with build_lock(directory, BUILD_WAIT_S) as held:
            return _load(directory) if held else _gave_up(directory)
    except OSError as error:  # a read-only cache, say
        logger.warning(
            "row-invariant float32 kernel: cannot build in its cache (%s); using torch's kernels", error
        )
        return None


def _gave_up(directory: Path) -> None:
    logger.warning(
        "row-invariant float32 kernel: another process held %s for %.0f s; using torch's kernels",
        directory / "build.flock",
        BUILD_WAIT_S,
    )


def _load(directory: Path) -> ModuleType | None:
    from torch.utils.cpp_extension import load

    logger.info("row-invariant float32 kernel: loading from %s (the first build takes about 30 s)", directory)
    try:
        module = load(
            name="spec_complete_row_invariant_linear",
            sources=[str(SOURCE)],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as error:  # a missing compiler or headers: run on torch's kernels instead
        logger.warning(
            "row-invariant float32 kernel could not be built (%s); using torch's kernels, "
            "which are slower for exact decoding on this CPU",
            str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__,
        )
        return None
    mode = os.environ.get("SPEC_COMPLETE_ROW_KERNEL")
    if mode == "avx2":
        module.set_wide_tiles(False)  # 256-bit verify blocks on an AVX-512 CPU: the same bits, to compare
    module.set_bf16_dot(mode not in ("avx2", "float32") and cpu_multiplies_bf16())
    wants_amx = mode not in ("avx2", "float32", "dot") and "amx_bf16" in cpu_flags()
    module.set_amx(wants_amx)
    if wants_amx and not module.amx():
        logger.warning("row-invariant kernel: no AMX tiles (%s); vdpbf16ps instead", module.amx_unavailable())
    return module


def bf16_dot() -> bool:
    """Whether Linears over bf16 panels take bf16 inputs and pair dot products (AVX512-BF16; see above)."""
    if not enabled():
        return False
    module = kernel()
    return module is not None and module.bf16_dot()


NUMERICS = ("float32", "bf16dot", "amx")


def numerics() -> str:
    """How Linears over bf16 panels multiply now, each with its own bits: "float32" (float32 inputs,
    fma chains; also where the kernel is off), "bf16dot" (bf16 inputs, vdpbf16ps) or "amx" (bf16
    inputs, AMX tiles)."""
    if not bf16_dot():
        return "float32"
    return "amx" if kernel().amx() else "bf16dot"


@contextmanager
def numerics_mode(name: str | None) -> Iterator[str]:
    """Run a block with Linears over bf16 panels multiplying as `name` (one of NUMERICS) says, as far
    as the CPU can (None: as they do); yields numerics() inside, so a caller sees what it got.

    Caches computed under other numerics hold other bits: a block builds its own runners. The
    setting is the process's: a forward on another thread meanwhile would mix numerics.
    """
    if name is not None and name not in NUMERICS:
        raise ValueError(f"unknown numerics {name!r}; choose one of {', '.join(NUMERICS)}")
    module = kernel()
    if module is None or name is None:
        yield numerics()
        return
    dot_before = module.set_bf16_dot(name != "float32")
    amx_before = module.set_amx(name == "amx")
    try:
        yield numerics()
    finally:
        module.set_amx(amx_before)
        module.set_bf16_dot(dot_before)


def cache_dtype(linears_bf16: bool, head_dim: int) -> torch.dtype:
    """The dtype of a kernel runner's KV cache: bfloat16 where its Linears' panels are bf16 (a bf16
    checkpoint), so that attention reads half the bytes; float32 for float32 panels, and in the
    bf16dot numerics for an odd head_dim (vdpbf16ps multiplies pairs).

    How a bf16 cache is read follows numerics(): "amx" and "bf16dot" multiply bf16 (AMX tiles,
    vdpbf16ps); "float32" runs the fma chains over each key and value widened exactly, the bits of a
    float32 cache holding the same rounded values (see the module's docstring)."""
    if not linears_bf16 or (numerics() == "bf16dot" and head_dim % 2):
        return torch.float32
    return torch.bfloat16


def usable(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether runners with this dtype and device multiply with the kernel (builds it if needed)."""
    return dtype == torch.float32 and device.type == "cpu" and enabled() and kernel() is not None


PANEL = 32  # output columns per panel (kPanel in the kernel)
AMX_K = 32  # the reduction length (in_features) of one AMX tile product (kAmxK in the kernel)


def linear(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None = None):
    """x [rows, K] @ weight.T (+ bias): weight given as panels [>= out_features / PANEL, K, PANEL], or
    in AMX tile order [>= out_features / PANEL, K / AMX_K, 1024] (pack_amx's; under the amx numerics).

    The panels may be a slice of a longer buffer (a panel's K x PANEL floats contiguous, panels at any
    stride): the KV cache keeps its keys and values this way so that attention runs on the kernel.
    """
    return kernel().linear(x, panels, out_features, bias)


def attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    tree: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """Causal attention of q [rows, heads, head_dim] over one layer's keys and values in the KV cache's
    panel layout (kv.KVCache with panels): row i attends to keys [0, lengths[i]). -> [rows, heads * head_dim].

    Scores are the kernel's fixed chains over head_dim, times scale; the softmax is the kernel's own
    (a polynomial exp), a function of the row's own scores; outputs are fixed chains over the keys. A
    row's result depends on nothing else (other rows, their count, threads), so attention needs no
    padding rows and no key buckets.

    tree (parents [nodes] int64, start): a token tree (a forest: several roots may be) whose node j's
    keys and values lie at position start + j, parents[j] < j or -1 (a root); the rows are its last
    `rows` nodes (a verify block: all of them; a draft head: the level it adds to earlier ones). A
    row attends to positions [0, start) and then to its node's root-to-node path (lengths[i] ==
    start + depth + 1), with the bits it would get were that path written at start, start + 1, ...:
    one call verifies a whole tree.

    A bfloat16 cache (`cache_dtype`) under the amx and bf16dot numerics is read with bf16
    products: q and the probabilities rounded to bf16, each score and output one chain over blocks
    of 32 of tdpbf16ps (AMX tiles), or over pairs of vdpbf16ps (bf16dot, an even head_dim);
    row-invariant too (the kernel's comments on amx_attention and dot_attention say why), with other
    bits; an error without AMX for an odd head_dim. Under the float32 numerics a bfloat16 cache is read
    by the fma chains above, each key and value widened exactly as it is read.
    """
    parents, start = tree if tree is not None else (None, 0)
    return kernel().attention(q, keys, values, lengths, scale, parents, start)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] / sqrt(mean(x^2) + eps) * weight, each row on its own (a fixed summation order)."""
    return kernel().rms_norm(x, weight, eps)


def rotary(
    qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding of qkv's [rows, (heads + 2 kv_heads) * d] q and k parts with cos, sin
    [rows, d], as Llama's rotate_half: -> q [rows, heads, d], k [rows, kv_heads, d]."""
    q, k = kernel().rotary(qkv, heads, kv_heads, cos, sin)
    return q, k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [rows, 2n] (gate first) -> [rows, n], element by element."""
    return kernel().silu_mul(gate_up)


def layer(
    x: torch.Tensor,
    norms: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    linears: LayerPanels,
    rope: tuple[torch.Tensor, torch.Tensor],
    heads: tuple[int, int],
    cache: tuple[torch.Tensor, torch.Tensor],
    start: int,
    lengths: torch.Tensor,
    scale: float,
    rows: tuple[int, int],
    parents: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decoder layer in one call: the same steps as the runner's loop (rms_norm, qkv, rotary, the
    cache write, attention, out, rms_norm, gate_up, silu_mul, down, the residual adds), so the same bits.

    x [n, hidden] at positions start..; norms (input, post); rope (cos, sin) [n, d]; heads (heads,
    kv_heads); cache (keys, values) of this layer in the panel layout, written for the n positions;
    lengths [n] keys each row sees; rows (first, end): the rows that go on past attention.
    parents: the rows are a token tree's last nodes (as `attention` takes them), written at
    start + len(parents) - n ..; rows must be (0, n).
    -> [end - first, hidden]
    """
    return kernel().layer(
        x,
        *norms,
        eps,
        linears.panels,
        linears.out_features,
        linears.biases,
        *rope,
        *heads,
        *cache,
        start,
        lengths,
        scale,
        *rows,
        parents,
    )


@dataclass(frozen=True, slots=True)
class LayerPanels:
    """A layer's four packed Linears (qkv, out, gate_up, down) as `layer` takes them."""

    panels: list[torch.Tensor]
    out_features: list[int]
    biases: list[torch.Tensor | None]

    @classmethod
    def of(cls, linears: tuple[PackedLinear, ...]) -> LayerPanels:
        return cls([a.panels for a in linears], [a.out_features for a in linears], [a.bias for a in linears])


@dataclass(frozen=True, slots=True)
class PackedLinear:
    """A Linear's weight packed for the kernel: call it as F.linear(x, weight, bias)."""

    # [ceil(out_features / 32), in_features, 32] float32 or bfloat16, or in AMX tile order (pack_amx)
    # [ceil(out_features / 32), in_features / 32, 1024] bfloat16
    panels: torch.Tensor
    out_features: int
    bias: torch.Tensor | None  # [out_features]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.panels, self.out_features, self.bias)

    def first_inputs(self, in_features: int) -> PackedLinear:
        """The Linear of the weight's first in_features columns, as a view of these panels (no copy,
        no second stream of those weights): the same products over the same k blocks, so the same
        bits as those columns packed apart into panels of the same dtype. In AMX tile order
        in_features must be a multiple of AMX_K."""
        per_step = AMX_K if self.amx_order else 1  # inputs per step of the panels' dim 1
        inputs = self.panels.shape[1] * per_step
        if not 0 < in_features <= inputs:
            raise ValueError(f"first_inputs: {in_features} of a weight's {inputs} inputs")
        if not self.splits_at(in_features):
            raise ValueError(f"AMX-ordered panels split at multiples of {AMX_K} inputs, not {in_features}")
        return PackedLinear(self.panels[:, : in_features // per_step], self.out_features, self.bias)

    def splits_at(self, in_features: int) -> bool:
        """Whether first_inputs(in_features) can view these panels (plain panels: any k)."""
        return not self.amx_order or in_features % AMX_K == 0

    @property
    def amx_order(self) -> bool:
        """Whether the panels are in AMX tile order (pack_amx's [P, K / AMX_K, 1024])."""
        return self.panels.shape[2] != PANEL


def is_bf16_valued(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 tensor is a bf16 value (a bf16 checkpoint loaded in float32)."""
    return torch.equal(weight.bfloat16().float(), weight)


def pack(
    weight: torch.Tensor, bias: torch.Tensor | None = None, bf16: bool | None = None, amx_order: bool = False
) -> PackedLinear:
    """weight [out_features, in_features] float32 on the CPU (and bias [out_features]) for the kernel.

    The panels are bfloat16 when every weight is a bf16 value (`bf16` None: checked here), else float32:
    the same chains and bits either way, half the bytes to stream with bf16 (decode steps read every
    weight once, so they run at memory speed).

    amx_order: where the numerics are "amx" now and in_features is a multiple of 32, bf16 panels are
    laid out in AMX tile order once here (the kernel's pack_amx), not re-laid at every product: the
    same bits, less work per weight streamed. Such panels are refused under other numerics (a clear
    error), so only a module built and used under one numerics asks for them.
    """
    module = kernel()
    if module is None:
        raise RuntimeError("the row-invariant kernel is not available here (see row_invariant.usable)")
    if bf16 is None:
        bf16 = is_bf16_valued(weight)
    contiguous_bias = None if bias is None else bias.contiguous()
    if bf16 and amx_order and numerics() == "amx" and weight.shape[1] % AMX_K == 0:
        panels = module.pack_amx(weight)
    else:
        panels = module.pack_bf16(weight) if bf16 else module.pack(weight)
    return PackedLinear(panels, weight.shape[0], contiguous_bias)
