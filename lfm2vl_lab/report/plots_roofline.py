"""The figure of the ``roofline`` file (:mod:`lfm2vl_lab.measure.roofline`): a decode step's kernels under
the GPU's two roofs (notebook 08 shows the file's boundary cost as a DataFrame)."""

from __future__ import annotations

from matplotlib.figure import Figure

from .plots import NoData, figure

CLASS_STYLE = {"GEMV": ("#2ca02c", "o"), "GEMM": ("#1f77b4", "s"), "attention": ("#d62728", "^"),
               "elementwise": ("#7f7f7f", "D")}


def roofline_figure(res: dict, title: str | None = None) -> Figure:
    """Left: each kernel's rate (TFLOP/s) against its arithmetic intensity (FLOPs per byte), log-log, under
    the roofs the same file measured (the bandwidth line, the GEMM peak). Right: the bandwidth each kernel
    reached against the bytes it moved, under the bandwidth roof and the line a kernel of fixed cost
    (the file's boundary cost in a graph) plus its bytes at full bandwidth would draw. The kit's Triton
    GEMV is drawn hollow beside ``F.linear``'s."""
    rows = [r for r in res.get("rows") or [] if r.get("bytes")]
    if not rows or len(res.get("peaks") or []) < 2:
        raise NoData("no kernel rows and roofs in this roofline file")
    bw, peak = res["peaks"][0]["gb_s"], res["peaks"][1]["tflop_s"]
    fig, (left, right) = figure(12, 5, title, cols=2)
    knee = peak * 1e3 / bw  # FLOPs per byte where the two roofs meet
    xs = [0.05, knee, 4 * max(knee, max(r["flops"] / r["bytes"] for r in rows))]
    left.plot(xs, [min(peak, x * bw / 1e3) for x in xs], color="black", lw=1.5,
              label=f"roofs: {bw / 1e3:.2f} TB/s, {peak:.0f} TFLOP/s (measured)")
    fixed = (res.get("boundary") or {}).get("graph", {}).get("us_per_kernel")
    sizes = sorted({r["bytes"] for r in rows})
    span = [sizes[0] / 2 * 1.5**i for i in range(64) if sizes[0] / 2 * 1.5**i <= 2 * sizes[-1]]
    right.axhline(bw, color="black", lw=1.5, label=f"bandwidth roof, {bw / 1e3:.2f} TB/s")
    if fixed:
        right.plot(span, [b / (fixed * 1e3 + b / bw) for b in span], "--", color="black", lw=1,
                   label=f"{fixed:.2f} µs per kernel + its bytes at the roof")
    for cls, (color, marker) in CLASS_STYLE.items():
        for impl, hollow in (("F.linear", False), ("triton", True), (None, False)):
            pts = [r for r in rows if r["class"] == cls and r.get("impl") == impl]
            if pts:
                style = {"s": 45, "marker": marker, "facecolors": "none" if hollow else color, "edgecolors": color,
                         "zorder": 3, "label": cls + {"F.linear": " (F.linear)",
                                                      "triton": " (the kit's Triton GEMV)"}.get(impl, "")}
                left.scatter([r["flops"] / r["bytes"] for r in pts if r["flops"]],
                             [r["tflop_s"] for r in pts if r["flops"]], **style)
                right.scatter([r["bytes"] for r in pts], [r["gb_s"] for r in pts], **style)
    left.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per byte moved)",
             ylabel="achieved rate (TFLOP/s)", title="the roofline")
    right.set(xscale="log", yscale="log", xlabel="bytes one call moves", ylabel="achieved bandwidth (GB/s)",
              title="bandwidth against size")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    return fig
