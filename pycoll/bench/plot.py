"""PNG plots of latency and busbw against message size (matplotlib, Agg, log axes)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping


def _matplotlib():
    try:
        import matplotlib
    except ImportError as e:   # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install matplotlib "
                           "(or pip install pycoll[bench])") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _size_label(n: float) -> str:
    n = int(n)
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= (1 << shift):
            return f"{n / (1 << shift):g}{unit}"
    return str(n)


def plot_series(series: Mapping[str, Iterable[tuple[int, float, float]]], path: str,
                title: str = "", busbw: bool = True) -> str:
    """One figure: latency (us) and busbw (GB/s) against size, one line per series.

    ``series`` maps a label to (size_bytes, latency_us, busbw_GBps) points.
    """
    plt = _matplotlib()
    from matplotlib.ticker import FuncFormatter, LogLocator

    ncols = 2 if busbw else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.2 * ncols, 4.4), squeeze=False)
    ax_lat = axes[0][0]
    ax_bw = axes[0][1] if busbw else None
    markers = "os^vD<>ph*"
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted((p for p in pts if p[0] > 0), key=lambda p: p[0])
        if not pts:
            continue
        xs = [p[0] for p in pts]
        m = markers[i % len(markers)]
        lat = [(x, p[1]) for x, p in zip(xs, pts) if p[1] and p[1] > 0]
        if lat:
            ax_lat.plot(*zip(*lat), marker=m, ms=3.5, lw=1.2, label=label)
        if ax_bw is not None:
            bw = [(x, p[2]) for x, p in zip(xs, pts) if p[2] and p[2] > 0]
            if bw:
                ax_bw.plot(*zip(*bw), marker=m, ms=3.5, lw=1.2, label=label)
    fmt = FuncFormatter(lambda v, _pos: _size_label(v))
    for ax, ylab in ((ax_lat, "latency (us)"), (ax_bw, "busbw (GB/s, 1e9 B)")):
        if ax is None:
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(fmt)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylab)
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.12)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rows(rows: list[dict], path: str, title: str = "") -> str:
    """Plot benchmark rows, one line per (library, ranks, dtype, op)."""
    series: dict[str, list] = {}
    for r in rows:
        label = f"{r.get('library', 'pycoll')} n={r['ranks']} {r['dtype']}"
        if r.get("op"):
            label += f" {r['op']}"
        series.setdefault(label, []).append((r["size"], r["avg_us"], r["busbw_GBps"]))
    return plot_series(series, path, title=title)
