"""On a GPU: the decode step's Triton GEMV (kernels/gemv.py), compiled for the card it runs on, gives
what an fp32 linear gives within bf16 rounding, on fresh random inputs, eagerly and from a replayed
CUDA graph (whose split-K counters must be back at zero for the next replay); a NaN is never lost."""

import pytest
import torch
import torch.nn.functional as F

from lfm2vl_lab.kernels import gemv as gemv_module
from lfm2vl_lab.kernels.gemv import cat_weights, gemv, gemv_shared, pick_config

pytestmark = pytest.mark.gpu

TOL = 1e-2  # bf16 output against an fp32 reference, relative to the reference's largest magnitude
# (rows of x, out_features, in_features): the 450M text model's decode shapes, and odd ones
SHAPES = [(1, 512, 1024), (1, 1024, 1024), (1, 3072, 1024), (1, 4608, 1024), (1, 1024, 4608),
          (1, 65536, 1024), (3, 1000, 1030), (4, 37, 4100)]


def _rel(y, x, w, b):
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_the_kernel_matches_fp32_eagerly_and_from_graph_replays(m, n, k):
    torch.manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert _rel(gemv(x, w, b), x, w, b) <= TOL
    static = x.clone()
    gemv(static, w, b)  # the first call of a shape compiles and makes its workspace, outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(static, w, b)
    for _ in range(3):  # fresh inputs each replay: a counter left over from the last one would show here
        static.copy_(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(y, static, w, b) <= TOL, pick_config(m, n, k)


def test_a_nan_reaches_the_outputs_it_touches():
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    x[0, 1023] = float("nan")
    assert gemv(x, w).isnan().all()
    x[0, 1023] = 0.0
    w[7, 0] = float("nan")
    y = gemv(x, w)
    assert y[0, 7].isnan() and not y[0, torch.arange(1024, device="cuda") != 7].isnan().any()


def test_linears_that_share_an_input_run_as_one_launch():
    ws = [torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16) for n in (1024, 512, 512)]
    weight, bias, sizes = cat_weights(ws)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    for y, w in zip(gemv_shared(x, weight, sizes, bias), ws):
        assert _rel(y, x, w, None) <= TOL


def test_decode_linear_compiled_and_captured_runs_the_kernel_for_few_rows_only():
    """torch.compile (inductor, whole graph) keeps the routed linear's few-row calls as the kernel, and
    a captured graph of it replays within bf16 rounding of fp32; many rows stay torch's GEMM."""
    from torch.profiler import ProfilerActivity, profile

    from lfm2vl_lab.kernels.router import decode_linear

    linear = decode_linear()
    w = torch.randn(4608, 1024, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda a: torch.nn.functional.silu(linear(a, w)), fullgraph=True)
    for rows in (1, 280):
        x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
        fn(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fn(x)
        x.copy_(torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        ref = torch.nn.functional.silu(torch.nn.functional.linear(x.float(), w.float()))
        assert ((y.float() - ref).abs().max() / ref.abs().max()).item() <= TOL
        gemv_kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                        and "gemv" in e.name]
        assert bool(gemv_kernels) == (rows == 1), (rows, [e.name for e in prof.events()][:10])


def test_two_routers_replayed_at_once_on_two_streams_stay_right():
    """Two engines' routers (decode_linear), each captured in a graph of split-K GEMVs of one shape and
    replayed by its own thread on its own stream at the same time: neither reads the other's partial
    sums or counters."""
    import threading

    from lfm2vl_lab.kernels.router import decode_linear

    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)  # the table splits K for this shape
    assert pick_config(1, 1024, 1024).split_k > 1
    runs, errors = [], []
    for seed in (1, 2):
        linear, stream = decode_linear(), torch.cuda.Stream()
        torch.manual_seed(seed)
        x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
        linear(x, w)  # compiles and makes this router's workspaces, outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            y = [linear(x, w) for _ in range(50)]
        runs.append((graph, stream, x, y))

    def replay(graph, stream, x, y):
        try:
            with torch.cuda.stream(stream):
                for _ in range(20):
                    graph.replay()
                stream.synchronize()
            assert all(_rel(out, x, w, None) <= TOL for out in y)
        except Exception as e:  # noqa: BLE001 (reported below, with the thread's failure)
            errors.append(e)

    threads = [threading.Thread(target=replay, args=run) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- gemv_rmsnorm: the RMSNorm before a linear group in the GEMV's kernel ------------------------

EPS = 1e-5
# (rows of x, out_features of each linear, in_features): the 450M model's groups after a norm (q/k/v after
# operator_norm, w1/w3 after ffn_norm, a conv layer's in_proj after operator_norm), and odd ones
NORM_SHAPES = [(1, (1024, 512, 512), 1024), (1, (4608, 4608), 1024), (1, (3072,), 1024), (4, (4608, 4608), 1024),
               (3, (1000,), 1030), (2, (37,), 4100)]


def _norm_rel(y, x, nw, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * nw.float()
    ref = F.linear(h, w.float())
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("m,sizes,k", NORM_SHAPES)
def test_the_norm_prologue_matches_fp32_eagerly_and_from_graph_replays(m, sizes, k):
    """One launch of norm and (concatenated) linears, within bf16 rounding of an all-fp32 norm and linear,
    and output for output (95% at least) Lfm2RMSNorm's own roundings followed by the plain product."""
    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm_shared, torch_gemv, torch_rmsnorm

    torch.manual_seed(k + sum(sizes))
    w = torch.randn(sum(sizes), k, device="cuda", dtype=torch.bfloat16)
    nw = (1 + 0.3 * torch.randn(k, device="cuda")).bfloat16()
    x = 3 * torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = torch.cat(gemv_rmsnorm_shared(x, nw, EPS, w, sizes), -1)
    assert _norm_rel(y, x, nw, w) <= TOL
    assert (y == torch_gemv(torch_rmsnorm(x, nw, EPS), w)).float().mean().item() >= 0.95
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.cat(gemv_rmsnorm_shared(static, nw, EPS, w, sizes), -1)
    for _ in range(3):  # fresh inputs each replay (and each split program's rstd of them)
        static.copy_(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _norm_rel(out, static, nw, w) <= TOL, pick_config(m, sum(sizes), k)


def test_a_nan_in_a_normed_row_reaches_all_its_outputs_and_no_others():
    from lfm2vl_lab.kernels.gemv import gemv_rmsnorm

    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)  # split K: every split sees the NaN
    nw = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 1024, device="cuda", dtype=torch.bfloat16)
    x[0, 1023] = float("nan")
    y = gemv_rmsnorm(x, nw, EPS, w)
    assert y[0].isnan().all() and not y[1].isnan().any()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs Hopper (sm90) or later")
def test_with_pdl_a_chain_of_dependent_launches_gives_the_same_bits_eagerly_and_from_a_graph(monkeypatch):
    """Each GEMV reads the one before it (split-K and not): a kernel that started before its input was
    written, or before the last launch's counters were back at zero, would change the bits."""
    torch.manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
          for n, k in ((4608, 1024), (1024, 4608), (512, 1024), (1024, 512), (1024, 1024))]

    def chain(x):  # 1024 -> 4608 -> 1024 -> 512 -> 1024 -> 1024, three times over
        for _ in range(3):
            for w in ws:
                x = gemv(x, w)
        return x

    def plain(x):  # the same chain with ordinary launches
        with pytest.MonkeyPatch.context() as m:
            m.setenv(gemv_module.PDL_ENV, "0")
            return chain(x)

    monkeypatch.setenv(gemv_module.PDL_ENV, "1")
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(chain(x), plain(x))
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = chain(static)
    for _ in range(3):
        static.copy_(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, plain(static))


@pytest.mark.parametrize("kind", ["residual", "swiglu", "swiglu+residual"])
@pytest.mark.parametrize("m,n,k", [(1, 1024, 1024), (1, 1024, 4608), (2, 1024, 1024), (4, 37, 4100)])
def test_the_residual_epilogue_and_activation_prologue_match_fp32_eagerly_and_from_graph_replays(kind, m, n, k):
    """The decode step's folds, ``residual + F.linear(x)`` (out_proj) and ``F.linear(silu(g) * u) (+ residual)``
    (w2 after w1/w3), against the same ops in fp32, eagerly and from replays on fresh inputs."""
    from lfm2vl_lab.kernels.gemv import gemv_residual, gemv_swiglu

    torch.manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    width = k if kind == "residual" else 2 * k

    def call(x, r):
        if kind == "residual":
            return gemv_residual(x, w, r)
        return gemv_swiglu(x, w, None, r if kind == "swiglu+residual" else None)

    def ref(x, r):
        a = x.float() if kind == "residual" else F.silu(x[:, :k].float()) * x[:, k:].float()
        y = F.linear(a, w.float())
        return y if kind == "swiglu" else y + r.float()

    def rel(y, want):
        return ((y.float() - want).abs().max() / want.abs().max()).item()

    x, r = (torch.randn(m, s, device="cuda", dtype=torch.bfloat16) for s in (width, n))
    assert rel(call(x, r), ref(x, r)) <= TOL
    sx, sr = x.clone(), r.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call(sx, sr)
    for _ in range(3):
        sx.copy_(torch.randn(m, width, device="cuda", dtype=torch.bfloat16))
        sr.copy_(torch.randn(m, n, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(y, ref(sx, sr)) <= TOL and torch.isfinite(y.float()).all()
