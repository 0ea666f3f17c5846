"""kernels/gemv.py: the decode step's Triton GEMV, on the CPU. The kernel itself runs in Triton's
interpreter (TRITON_INTERPRET=1 must be set before Triton is imported, hence one subprocess that runs
every kernel check and prints its findings); the table, the input checks and the plain-torch fallback
run here. The GPU half (speed, and the same comparison on the real kernel) is scripts/boundary_probe.py's."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from interpreter import run_interpreted

from lfm2vl_lab.kernels.gemv import (
    MAX_M,
    GemvConfig,
    cat_weights,
    check_inputs,
    gemv,
    gemv_shared,
    pick_config,
    torch_gemv,
)

TOL = 1e-2  # bf16 output against an fp32 reference, relative to the output's largest magnitude

# (m, n, k, config, bias): odd N and K, K split or not, one to four rows, the table's own pick (None)
CASES = [(1, 40, 70, GemvConfig(16, 32), True), (1, 40, 70, GemvConfig(16, 32, 2), False),
         (3, 37, 96, GemvConfig(8, 16, 4), True), (4, 64, 128, None, False), (2, 33, 200, GemvConfig(8, 64, 8), True),
         (1, 48, 64, GemvConfig(16, 64), False), (1, 24, 1024, None, True)]

INTERPRETED = textwrap.dedent("""
    import json, torch, torch.nn.functional as F
    from lfm2vl_lab.kernels import gemv as G, router as R
    CASES = json.loads(%r)
    def rel(y, ref):
        return ((y.float() - ref).abs().max() / ref.abs().max()).item()
    out = {"cases": [], "nan": [], "counters_zero": None}
    g = torch.Generator().manual_seed(0)
    for m, n, k, cfg, bias in CASES:
        cfg = cfg and G.GemvConfig(*cfg)
        x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((m, k), (n, k), (n,)))
        b = b if bias else None
        y = G.gemv(x, w, b, cfg)
        ref = F.linear(x.float(), w.float(), None if b is None else b.float())
        again = G.gemv(x, w, b, cfg)  # a second call (a graph replay's case): split-K counters were reset
        out["cases"].append({"shape": list(y.shape), "dtype": str(y.dtype), "rel": rel(y, ref),
                             "same_again": torch.equal(y, again)})
    out["counters_zero"] = all(int(t.abs().sum()) == 0 for key, t in G._WORKSPACES.items() if key[2] == "counters")
    x, w = torch.randn(1, 70, generator=g).bfloat16(), torch.randn(40, 70, generator=g).bfloat16()
    for cfg in (G.GemvConfig(16, 32), G.GemvConfig(8, 16, 4)):
        xn = x.clone(); xn[0, 69] = float("nan")  # in the last, partial chunk of K
        wn = w.clone(); wn[5, 3] = float("nan")
        out["nan"].append({"x_all_nan": bool(G.gemv(xn, w, None, cfg).isnan().all()),
                           "w_row_nan": G.gemv(x, wn, None, cfg)[0].isnan().nonzero().flatten().tolist()})
    ws = [torch.randn(n, 96, generator=g).bfloat16() for n in (32, 16, 16)]
    bs = [torch.randn(n, generator=g).bfloat16() for n in (32, 16, 16)]
    wcat, bcat, sizes = G.cat_weights(ws, bs)
    x = torch.randn(2, 96, generator=g).bfloat16()
    cfg = G.GemvConfig(16, 32, 3)
    parts = G.gemv_shared(x, wcat, sizes, bcat, cfg)
    out["shared"] = {"sizes": list(sizes), "rel": [rel(p, F.linear(x.float(), w.float(), b.float()))
                                                    for p, w, b in zip(parts, ws, bs)],
                     "equal_to_separate": [torch.equal(p, G.gemv(x, w, b, cfg)) for p, w, b in zip(parts, ws, bs)]}
    from torch._dynamo.testing import CompileCounter
    counter = CompileCounter()
    fn = torch.compile(lambda a, w, s: torch.ops.lfm2vl.gemv(a, w, None, s), backend=counter, fullgraph=True)
    R.gemv_op()
    x, w = torch.randn(1, 70, generator=g).bfloat16(), torch.randn(40, 70, generator=g).bfloat16()
    ys = [fn(x, w, torch.tensor(space)) for space in (201, 202)]
    out["spaces"] = {"frames": counter.frame_count, "rel": [rel(y, F.linear(x.float(), w.float())) for y in ys],
                     "used": sorted({key[0] for key in G._WORKSPACES if key[0] in (201, 202)})}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def interpreted():
    """Every kernel check, run once by Triton's interpreter in a subprocess."""
    cases = json.dumps([[m, n, k, cfg and list(cfg), bias] for m, n, k, cfg, bias in CASES])
    return run_interpreted(INTERPRETED % cases)


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: "m{}-n{}-k{}".format(*CASES[i][:3]))
def test_the_kernel_matches_an_fp32_linear_within_bf16_rounding(interpreted, i):
    m, n, k, _, _ = CASES[i]
    case = interpreted["cases"][i]
    assert case["shape"] == [m, n] and case["dtype"] == "torch.bfloat16"
    assert case["rel"] <= TOL, case
    assert case["same_again"], "a second call differs: the split-K counters were not put back to zero"


def test_split_k_counters_go_back_to_zero(interpreted):
    assert interpreted["counters_zero"]


def test_nan_is_never_masked_away(interpreted):
    """A NaN in x (in K's last, partial chunk) reaches every output; one in W's row 5 reaches y[5] only."""
    for found in interpreted["nan"]:
        assert found == {"x_all_nan": True, "w_row_nan": [5]}


def test_linears_that_share_an_input_run_as_one(interpreted):
    shared = interpreted["shared"]
    assert shared["sizes"] == [32, 16, 16]
    assert max(shared["rel"]) <= TOL, shared
    assert all(shared["equal_to_separate"]), shared


# --- here, without the interpreter --------------------------------------------------------------


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


@pytest.mark.parametrize("bad,needle", [
    (lambda: (torch.ones(1, 8, dtype=torch.int32), _bf16(4, 8), None), "x dtype torch.int32"),
    (lambda: (_bf16(1, 8), torch.randn(4, 8), None), "weight dtype torch.float32"),
    (lambda: (_bf16(1, 9), _bf16(4, 8), None), "x shape (1, 9)"),
    (lambda: (_bf16(1, 8), _bf16(8, 4).t(), None), "weight strides (1, 4)"),
    (lambda: (_bf16(1, 8), _bf16(4, 8), _bf16(5)), "bias shape (5,)"),
    (lambda: (_bf16(1, 8), _bf16(4, 8), torch.randn(4)), "bias torch.float32"),
    (lambda: (_bf16(1, 8), _bf16(2, 4, 8), None), "weight shape (2, 4, 8)"),
], ids=["x-int", "w-fp32", "k-mismatch", "w-transposed", "bias-shape", "bias-dtype", "w-3d"])
def test_bad_input_is_one_line_naming_the_value(bad, needle):
    x, w, b = bad()
    with pytest.raises(ValueError) as err:
        gemv(x, w, b)
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError):
        check_inputs(x, w, b)


def test_shared_sizes_must_cover_the_weight():
    w, b, sizes = cat_weights([_bf16(4, 8), _bf16(2, 8)])
    assert b is None and sizes == (4, 2) and w.shape == (6, 8)
    with pytest.raises(ValueError, match=r"sizes \(4, 1\) add up to 5, weight has 6 rows"):
        gemv_shared(_bf16(1, 8), w, (4, 1))
    with pytest.raises(ValueError, match="all or none"):
        cat_weights([_bf16(4, 8), _bf16(2, 8)], [_bf16(4), None])


def test_without_triton_or_a_gpu_it_is_the_plain_product(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, w, b = _bf16(3, 40), _bf16(24, 40), _bf16(24)
    y = gemv(x, w, b)
    assert torch.equal(y, torch_gemv(x, w, b))
    ref = F.linear(x.float(), w.float(), b.float())
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() <= TOL
    assert gemv(_bf16(2, 3, 40), w).shape == (2, 3, 24)  # leading dims kept
    assert torch.isnan(gemv(torch.full((1, 40), float("nan")).bfloat16(), w)).all()
    assert gemv(_bf16(MAX_M + 1, 40), w).shape == (MAX_M + 1, 24)  # more rows than the kernel takes: torch


# The 450M text model's decode linears (in, out) and the q/k/v and gate/up concatenations
DECODE_SHAPES = [(1024, 512), (1024, 1024), (1024, 3072), (1024, 4608), (1024, 65536), (4608, 1024),
                 (1024, 2048), (1024, 9216)]


@pytest.mark.parametrize("k,n", DECODE_SHAPES)
def test_the_table_fills_an_h200_with_wide_chunks(k, n):
    cfg = pick_config(1, n, k, sms=132)
    programs = -(-n // cfg.block_n) * cfg.split_k
    k_tiles = -(-k // cfg.block_k)
    assert cfg.block_k >= 128 and cfg.block_k & (cfg.block_k - 1) == 0 and cfg.block_n in (8, 16)
    assert programs >= 2 * 132 or cfg.split_k * 2 > k_tiles, cfg  # enough programs, or K split as far as it goes
    assert cfg.block_n * cfg.block_k <= 16384 or cfg.num_warps == 8


@pytest.mark.parametrize("m", range(2, MAX_M + 1))
def test_the_table_never_splits_k_for_two_rows_or_more(m):
    """Two or more rows split over K gave sums that differed from run to run on the H200 (the table's
    docstring): the table keeps such a launch whole, whatever its shape."""
    for k, n in DECODE_SHAPES:
        assert pick_config(m, n, k, sms=132).split_k == 1, (m, n, k)
    assert pick_config(1, 1024, 4608, sms=132).split_k > 1  # one row still splits where it pays


def test_the_table_keeps_small_shapes_legal():
    for m in range(1, MAX_M + 1):
        for n, k in ((1, 1), (3, 5), (17, 33)):
            cfg = pick_config(m, n, k)
            assert cfg.block_k >= 16 and cfg.split_k >= 1 and cfg.split_k <= max(1, -(-k // cfg.block_k))


def test_decode_linear_is_torchs_own_where_the_kernel_does_not_run_and_compiles_whole():
    """On the CPU every call stays torch's F.linear, bit for bit, and torch.compile traces a function
    that calls it (as the engine's layer functions do) with no graph break."""
    from torch._dynamo.testing import CompileCounter

    from lfm2vl_lab.kernels.router import decode_linear

    m = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    linear = decode_linear()
    assert torch.equal(linear(x, m.weight, m.bias), F.linear(x, m.weight, m.bias))
    counter = CompileCounter()
    routed = torch.compile(lambda a: linear(a, m.weight, m.bias) * 2, backend=counter, fullgraph=True)(x)
    assert torch.equal(routed, m(x) * 2) and counter.frame_count == 1


def test_the_custom_op_is_the_kernels_product():
    from lfm2vl_lab.kernels.router import gemv_op

    x, w, b = torch.randn(2, 64).bfloat16(), torch.randn(48, 64).bfloat16(), torch.randn(48).bfloat16()
    space = torch.tensor(0)
    assert torch.equal(torch.ops.lfm2vl.gemv(x, w, b, space), torch_gemv(x, w, b))
    torch.library.opcheck(gemv_op(), (x, w, b, space))  # its fake (shape-only) version agrees with it


def test_one_compiled_function_uses_each_routers_own_workspaces(interpreted):
    """The kernel in Triton's interpreter, behind torch.compile: one compiled function, called with two
    routers' spaces, splits K into each space's own workspace (a graph captured for one engine holds
    that engine's buffers), and both products are right."""
    spaces = interpreted["spaces"]
    assert spaces["frames"] == 1 and spaces["used"] == [201, 202] and max(spaces["rel"]) <= TOL


def test_routers_of_several_engines_share_one_compiled_function():
    """Each router names its own workspaces, yet a function compiled with one router serves the next
    without compiling again: a second engine on the same model does not pay the first one's compile."""
    from torch._dynamo.testing import CompileCounter

    from lfm2vl_lab.kernels.router import decode_linear

    counter = CompileCounter()
    fn = torch.compile(lambda a, w, linear: linear(a, w) * 2, backend=counter, fullgraph=True)
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    routers = [decode_linear() for _ in range(3)]
    for linear in routers:
        assert torch.equal(fn(x, w, linear), F.linear(x, w) * 2)
    assert counter.frame_count == 1 and len({int(r.space) for r in routers}) == 3


def test_each_space_has_workspaces_of_its_own():
    """Split-K buffers are kept per space: calls in one space reuse them, two spaces (two engines'
    routers, which two threads may replay at once) never share one."""
    from lfm2vl_lab.kernels.gemv import _workspace

    cpu = torch.device("cpu")
    one, again = (_workspace(cpu, "counters", 8, torch.int32, space=101) for _ in range(2))
    other = _workspace(cpu, "counters", 8, torch.int32, space=102)
    assert one is again and one.data_ptr() != other.data_ptr() and not one.any()


# --- gemv_rmsnorm: the RMSNorm before a linear group, taken into the GEMV ------------------------

# (m, n, k, config, bias, dtype): odd N and K, K split or not, one to four rows, the table's pick (None)
NORM_CASES = [(1, 40, 70, GemvConfig(16, 32), True, "bfloat16"),
              (1, 40, 70, GemvConfig(16, 32, 2), False, "bfloat16"),
              (3, 37, 96, GemvConfig(8, 16, 4), False, "bfloat16"),
              (4, 33, 200, GemvConfig(8, 64, 8), True, "bfloat16"),
              (2, 24, 1024, None, True, "bfloat16"), (4, 48, 130, None, False, "float16"),
              (2, 40, 70, GemvConfig(8, 32, 2), True, "float32")]
EPS = 1e-5

# Triton's interpreter casts fp32 to bf16 by truncation where the GPU (and torch) round to nearest even,
# so a bf16 kernel in the interpreter would be off by up to two ulps more than on the GPU. For these checks
# the subprocess makes the interpreter's fp32 -> bf16 cast round as torch does (fp16's already does).
NORM_INTERPRETED = textwrap.dedent("""
    import json, numpy as np, torch, torch.nn.functional as F, triton.language as tl
    import triton.runtime.interpreter as I
    _cast = I._convert_float
    def _round_like_torch(a, src, dst, mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(a).view(np.float32).copy()).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view(np.uint16).reshape(a.shape)
        return _cast(a, src, dst, mode)
    I._convert_float = _round_like_torch
    from lfm2vl_lab.kernels import gemv as G
    CASES, EPS = json.loads(%r), %r
    g = torch.Generator().manual_seed(0)
    def data(m, n, k, dtype):
        x = (3 * torch.randn(m, k, generator=g)).to(dtype)
        nw = (1 + 0.3 * torch.randn(k, generator=g)).to(dtype)
        return x, nw, torch.randn(n, k, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
    def ref(x, nw, w, b):  # all in fp32: the norm unrounded, then the linear
        h = x.float(); h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * nw.float()
        return F.linear(h, w.float(), None if b is None else b.float())
    def rel(y, r):
        return ((y.float() - r).abs().max() / r.abs().max()).item()
    out = {"cases": []}
    for m, n, k, cfg, bias, dtype in CASES:
        cfg = cfg and G.GemvConfig(*cfg)
        x, nw, w, b = data(m, n, k, getattr(torch, dtype))
        b = b if bias else None
        y = G.gemv_rmsnorm(x, nw, EPS, w, b, cfg)
        plain = G.torch_gemv(G.torch_rmsnorm(x, nw, EPS), w, b)  # Lfm2RMSNorm, then the linear
        out["cases"].append({"shape": list(y.shape), "dtype": str(y.dtype), "rel": rel(y, ref(x, nw, w, b)),
                             "equal_share": (y == plain).float().mean().item(),
                             "same_again": torch.equal(y, G.gemv_rmsnorm(x, nw, EPS, w, b, cfg))})
    out["counters_zero"] = all(int(t.abs().sum()) == 0 for key, t in G._WORKSPACES.items() if key[2] == "counters")
    out["nan"] = []
    for cfg in (G.GemvConfig(16, 32), G.GemvConfig(8, 16, 4)):
        x, nw, w, _ = data(2, 40, 70, torch.bfloat16)
        xn = x.clone(); xn[0, 69] = float("nan")  # row 0 only, in the last, partial chunk of K
        nwn = nw.clone(); nwn[3] = float("nan")
        wn = w.clone(); wn[5, 3] = float("nan")
        y_x, y_nw, y_w = G.gemv_rmsnorm(xn, nw, EPS, w, None, cfg), G.gemv_rmsnorm(x, nwn, EPS, w, None, cfg), \\
            G.gemv_rmsnorm(x, nw, EPS, wn, None, cfg)
        out["nan"].append({"x_row": [bool(y_x[0].isnan().all()), bool(y_x[1].isnan().any())],
                           "norm_weight": bool(y_nw.isnan().all()),
                           "w_row": y_w.isnan().any(0).nonzero().flatten().tolist()})
    x, nw, _, _ = data(2, 1, 96, torch.bfloat16)
    ws = [torch.randn(n, 96, generator=g).bfloat16() for n in (32, 16, 16)]
    wcat, _, sizes = G.cat_weights(ws)
    cfg = G.GemvConfig(16, 32, 3)
    parts = G.gemv_rmsnorm_shared(x, nw, EPS, wcat, sizes, None, cfg)
    out["shared"] = {"rel": [rel(p, ref(x, nw, w, None)) for p, w in zip(parts, ws)],
                     "equal_to_separate": [torch.equal(p, G.gemv_rmsnorm(x, nw, EPS, w, None, cfg))
                                           for p, w in zip(parts, ws)]}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def norm_interpreted():
    """Every gemv_rmsnorm kernel check, run once by Triton's interpreter in a subprocess."""
    cases = json.dumps([[m, n, k, cfg and list(cfg), bias, dt] for m, n, k, cfg, bias, dt in NORM_CASES])
    return run_interpreted(NORM_INTERPRETED % (cases, EPS))


@pytest.mark.parametrize("i", range(len(NORM_CASES)), ids=lambda i: "m{}-n{}-k{}-{}".format(
    *NORM_CASES[i][:3], NORM_CASES[i][5]))
def test_the_norm_prologue_matches_fp32_and_rounds_as_lfm2_rmsnorm(norm_interpreted, i):
    """Within 1e-2 of an all-fp32 norm and linear; and, in 16 bits, equal output for output (95% at least:
    the rstd's sum runs in another order) to Lfm2RMSNorm's own roundings followed by the plain product,
    which a norm rounded in another order is not (in fp32 the sums' order alone moves the last bit)."""
    m, n, k, _, _, dtype = NORM_CASES[i]
    case = norm_interpreted["cases"][i]
    assert case["shape"] == [m, n] and case["dtype"] == f"torch.{dtype}"
    assert case["rel"] <= TOL, case
    assert dtype == "float32" or case["equal_share"] >= 0.95, case
    assert case["same_again"], "a second call differs: the split-K counters were not put back to zero"


def test_the_norm_prologue_leaves_the_split_k_counters_at_zero(norm_interpreted):
    assert norm_interpreted["counters_zero"]


def test_a_nan_reaches_what_the_norm_spreads_it_to(norm_interpreted):
    """A NaN in a row of x makes that row's rstd NaN (all its outputs, no other row's); one in the norm
    weight reaches every output; one in W's row 5 only output 5."""
    for found in norm_interpreted["nan"]:
        assert found == {"x_row": [True, False], "norm_weight": True, "w_row": [5]}


def test_a_normed_group_runs_as_one_launch(norm_interpreted):
    shared = norm_interpreted["shared"]
    assert max(shared["rel"]) <= TOL and all(shared["equal_to_separate"]), shared


@pytest.mark.parametrize("bad,needle", [
    (lambda: (_bf16(9), 1e-5), "norm_weight shape (9,)"),
    (lambda: (_bf16(1, 8), 1e-5), "norm_weight shape (1, 8)"),
    (lambda: (torch.randn(8), 1e-5), "norm_weight torch.float32"),
    (lambda: (_bf16(16)[::2], 1e-5), "norm_weight stride (2,)"),
    (lambda: (_bf16(8), 0.0), "eps 0.0"),
    (lambda: (_bf16(8), -1e-6), "eps -1e-06"),
    (lambda: (_bf16(8), float("nan")), "eps nan"),
    (lambda: (_bf16(8), None), "eps None"),
], ids=["nw-short", "nw-2d", "nw-fp32", "nw-strided", "eps-0", "eps-neg", "eps-nan", "eps-none"])
def test_a_bad_norm_input_is_one_line_naming_the_value(bad, needle):
    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm

    nw, eps = bad()
    with pytest.raises(ValueError) as err:
        gemv_rmsnorm(_bf16(1, 8), nw, eps, _bf16(4, 8))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_without_triton_the_norm_is_lfm2s_own_then_the_plain_product(monkeypatch):
    from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm

    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm, gemv_rmsnorm_shared, torch_rmsnorm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    norm = Lfm2RMSNorm(40, eps=EPS).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(40))
    x, w, b = 3 * _bf16(3, 40), _bf16(24, 40), _bf16(24)
    assert torch.equal(torch_rmsnorm(x, norm.weight, EPS), norm(x))  # transformers' module, bit for bit
    y = gemv_rmsnorm(x, norm.weight, EPS, w, b)
    assert torch.equal(y, torch_gemv(norm(x), w, b))
    assert gemv_rmsnorm(_bf16(2, 3, 40), norm.weight, EPS, w).shape == (2, 3, 24)
    q, k = gemv_rmsnorm_shared(x, norm.weight, EPS, w, (16, 8), b)
    assert torch.equal(torch.cat([q, k], -1), y)
    with pytest.raises(ValueError, match=r"sizes \(16, 4\) add up to 20"):
        gemv_rmsnorm_shared(x, norm.weight, EPS, w, (16, 4))


# --- gemv_residual and gemv_swiglu: the residual add after a linear, the MLP's activation before one -----

# (m, n, k, config, bias, dtype, kind): kind "res" (residual + linear), "swiglu" (linear of silu(g) * u),
# "both" (the MLP's down projection as the fused engine runs it); K split or not, one to four rows
FOLD_CASES = [(1, 40, 70, GemvConfig(16, 32), True, "bfloat16", "res"),
              (3, 37, 96, GemvConfig(8, 16, 4), False, "bfloat16", "res"),
              (1, 40, 70, GemvConfig(16, 32, 2), False, "bfloat16", "swiglu"),
              (4, 33, 200, GemvConfig(8, 64, 8), True, "bfloat16", "swiglu"),
              (2, 24, 1024, None, False, "bfloat16", "both"), (4, 48, 130, None, True, "float16", "both"),
              (2, 40, 70, GemvConfig(8, 32, 2), True, "float32", "both")]

FOLD_INTERPRETED = NORM_INTERPRETED.split("from lfm2vl_lab.kernels import gemv as G")[0] + textwrap.dedent("""
    from lfm2vl_lab.kernels import gemv as G
    CASES = json.loads(%r)
    g = torch.Generator().manual_seed(0)
    def data(m, n, k, dtype, kind):
        x = torch.randn(m, 2 * k if kind != "res" else k, generator=g).to(dtype)
        r = (4 * torch.randn(m, n, generator=g)).to(dtype)
        return x, r, (torch.randn(n, k, generator=g) / 4).to(dtype), torch.randn(n, generator=g).to(dtype)
    def act(x, kind):  # the row the linear reads, in fp32 (unrounded), or in x's dtype as torch rounds it
        return x if kind == "res" else F.silu(x[:, :x.shape[1] // 2]) * x[:, x.shape[1] // 2:]
    def call(x, w, b, r, kind, cfg):
        if kind == "res":
            return G.gemv_residual(x, w, r, b, cfg)
        return G.gemv_swiglu(x, w, b, r if kind == "both" else None, cfg)
    def rel(y, ref):
        return ((y.float() - ref).abs().max() / ref.abs().max()).item()
    out = {"cases": []}
    for m, n, k, cfg, bias, dtype, kind in CASES:
        cfg = cfg and G.GemvConfig(*cfg)
        x, r, w, b = data(m, n, k, getattr(torch, dtype), kind)
        b = b if bias else None
        y = call(x, w, b, r, kind, cfg)
        ref = F.linear(act(x.float(), kind), w.float(), None if b is None else b.float())
        ref = ref if kind == "swiglu" else ref + r.float()
        plain = G.torch_gemv(act(x, kind), w, b)  # torch's own ops, rounded where torch rounds
        plain = plain if kind == "swiglu" else r + plain
        out["cases"].append({"shape": list(y.shape), "dtype": str(y.dtype), "rel": rel(y, ref),
                             "equal_share": (y == plain).float().mean().item(),
                             "same_again": torch.equal(y, call(x, w, b, r, kind, cfg))})
    out["counters_zero"] = all(int(t.abs().sum()) == 0 for key, t in G._WORKSPACES.items() if key[2] == "counters")
    x, r, w, _ = data(2, 40, 70, torch.bfloat16, "both")
    cfg = G.GemvConfig(8, 16, 4)
    xn = x.clone(); xn[0, 69] = float("nan")  # row 0's gate, in the last, partial chunk of K
    un = x.clone(); un[1, 70] = float("nan")  # row 1's up, at its first column
    rn = r.clone(); rn[1, 7] = float("nan")
    out["nan"] = {"gate": G.gemv_swiglu(xn, w, None, r, cfg).isnan().nonzero().tolist(),
                  "up": G.gemv_swiglu(un, w, None, r, cfg).isnan().any(1).tolist(),
                  "residual": G.gemv_swiglu(x, w, None, rn, cfg).isnan().nonzero().tolist()}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def fold_interpreted():
    """Every gemv_residual / gemv_swiglu kernel check, run once by Triton's interpreter in a subprocess."""
    cases = json.dumps([[m, n, k, cfg and list(cfg), bias, dt, kind] for m, n, k, cfg, bias, dt, kind in FOLD_CASES])
    return run_interpreted(FOLD_INTERPRETED % cases)


@pytest.mark.parametrize("i", range(len(FOLD_CASES)), ids=lambda i: "m{}-n{}-k{}-{}-{}".format(
    *FOLD_CASES[i][:3], FOLD_CASES[i][5], FOLD_CASES[i][6]))
def test_the_activation_prologue_and_residual_epilogue_match_fp32_and_round_as_torch(fold_interpreted, i):
    """Within 1e-2 of the all-fp32 ops; and, in 16 bits, equal output for output (95% at least: the product
    sums in another order than torch's) to torch's own ops on the same tensors, ``residual + F.linear(x)``
    and ``F.linear(F.silu(g) * u)``, which a kernel that skipped a rounding or rounded elsewhere is not."""
    m, n, k, _, _, dtype, _ = FOLD_CASES[i]
    case = fold_interpreted["cases"][i]
    assert case["shape"] == [m, n] and case["dtype"] == f"torch.{dtype}"
    assert case["rel"] <= TOL, case
    assert dtype == "float32" or case["equal_share"] >= 0.95, case
    assert case["same_again"], "a second call differs: the split-K counters were not put back to zero"
    assert fold_interpreted["counters_zero"]


def test_a_nan_in_the_gate_up_or_residual_reaches_only_what_it_feeds(fold_interpreted):
    """A NaN gate or up value feeds every output of its row (no other row's); a NaN residual value only
    the output it is added to."""
    nan = fold_interpreted["nan"]
    assert sorted({r for r, _ in nan["gate"]}) == [0] and len(nan["gate"]) == 40
    assert nan["up"] == [False, True]
    assert nan["residual"] == [[1, 7]]


@pytest.mark.parametrize("call,needle", [
    (lambda G: G.gemv_residual(_bf16(2, 8), _bf16(4, 8), _bf16(2, 5)), "residual shape (2, 5), expected (2, 4)"),
    (lambda G: G.gemv_residual(_bf16(2, 8), _bf16(4, 8), torch.randn(2, 4)), "residual torch.float32"),
    (lambda G: G.gemv_swiglu(_bf16(2, 8), _bf16(4, 8)), "h shape (2, 8) does not end in twice"),
    (lambda G: G.gemv_swiglu(_bf16(2, 16), _bf16(4, 8), None, _bf16(4)), "residual shape (4,)"),
], ids=["res-shape", "res-dtype", "swiglu-width", "swiglu-res"])
def test_a_bad_fold_input_is_one_line_naming_the_value(call, needle):
    from lfm2vl_lab.kernels import gemv as G

    with pytest.raises(ValueError) as err:
        call(G)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_without_triton_the_folds_are_torchs_own_ops(monkeypatch):
    from lfm2vl_lab.kernels.gemv import gemv_residual, gemv_swiglu
    from lfm2vl_lab.kernels.router import decode_linear

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, h, w, b, r = _bf16(3, 40), _bf16(3, 80), _bf16(24, 40), _bf16(24), _bf16(3, 24)
    assert torch.equal(gemv_residual(x, w, r, b), r + torch_gemv(x, w, b))
    g, u = h.chunk(2, -1)
    assert torch.equal(gemv_swiglu(h, w, b, r), r + torch_gemv(F.silu(g) * u, w, b))
    router = decode_linear()  # on a CPU: every call is torch's own F.linear and the ops around it
    assert torch.equal(router.residual_linear(x, w, b, r), r + F.linear(x, w, b))
    assert torch.equal(router.swiglu_linear(h, w, b, r), r + F.linear(F.silu(g) * u, w, b))
