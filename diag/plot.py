"""A picture of a pin run's timeline: pinned percent, pin rate and swap-in rate over time.

matplotlib is an optional extra (`pip install 'hostpin[plot]'`): without it `timeline_png`
raises PlotUnavailable and the report says how to get the picture.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["timeline_series", "timeline_png", "budget_png", "PlotUnavailable"]

DEFAULT_PAGE = 4096  # runs recorded before the page size was kept in result.json were all on 4 KiB nodes
GiB = 1 << 30


class PlotUnavailable(RuntimeError):
    pass


def timeline_series(samples: list[dict], page_size: int = DEFAULT_PAGE) -> dict[str, list[float]]:
    """Per sample from the pin's start: time, pinned percent, pin rate (GiB/s), swap-in (pages/s).
    Progress is counted in the node's pages (page_size, from the run's result)."""
    pin = [s for s in samples if s.get("phase") in ("pin", "undo")]
    if not pin:
        return {"t": [], "pct": [], "rate_gib_s": [], "swapin_pages_s": [], "phase": []}
    t0 = pin[0]["t"]
    out = {"t": [], "pct": [], "rate_gib_s": [], "swapin_pages_s": [], "phase": []}
    prev = None
    for s in samples:
        if s["t"] < t0 - 1e-9:
            prev = s
            continue
        prog = s.get("progress", {})
        vm = s.get("vm", {})
        out["t"].append(s["t"] - t0)
        out["pct"].append(prog.get("pct") if prog.get("pct") is not None else (out["pct"][-1] if out["pct"] else 0.0))
        if prev is not None and s["t"] > prev["t"]:
            dt = s["t"] - prev["t"]
            pages = vm.get("hostpin_progress_pages", 0) - prev.get("vm", {}).get("hostpin_progress_pages", 0)
            out["rate_gib_s"].append(max(0.0, pages) * page_size / GiB / dt)
            out["swapin_pages_s"].append(max(0, vm.get("pswpin", 0) - prev.get("vm", {}).get("pswpin", 0)) / dt)
        else:
            out["rate_gib_s"].append(0.0)
            out["swapin_pages_s"].append(0.0)
        out["phase"].append(s.get("phase"))
        prev = s
    return out


def timeline_png(samples: list[dict], path: Path | str, title: str = "", page_size: int = DEFAULT_PAGE) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("matplotlib is not installed: pip install 'hostpin[plot]' for the timeline picture") from exc
    series = timeline_series(samples, page_size)
    if not series["t"]:
        raise PlotUnavailable("no pin phase in this timeline")
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    axes[0].plot(series["t"], series["pct"], color="tab:blue")
    axes[0].set_ylabel("pinned %")
    axes[0].set_ylim(0, 105)
    axes[1].plot(series["t"], series["rate_gib_s"], color="tab:green")
    axes[1].set_ylabel("pin rate GiB/s")
    axes[2].plot(series["t"], series["swapin_pages_s"], color="tab:red")
    axes[2].set_ylabel("swap-in pages/s")
    axes[2].set_xlabel("seconds since the pin started")
    undo = next((t for t, ph in zip(series["t"], series["phase"]) if ph == "undo"), None)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if undo is not None:
            ax.axvline(undo, color="grey", linestyle="--", linewidth=0.8)
    return _save(plt, fig, title or "hostpin pin timeline", path)


def budget_png(budget: dict, path: Path | str, title: str = "") -> Path:
    """A phase's time budget (--trace): its time split by cause, and the latency histograms of its
    I/O (request issue to completion, and the thread's sleeps)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("matplotlib is not installed: pip install 'hostpin[plot]' for the budget picture") from exc
    causes = budget.get("causes") or {}
    if not causes:
        raise PlotUnavailable("no time budget in this run")
    io = budget.get("io") or {}
    fig, axes = plt.subplots(2, 1, figsize=(9, 6))
    from .trace.budget import CAUSES
    names = sorted(causes, key=lambda c: CAUSES.index(c) if c in CAUSES else len(CAUSES))
    axes[0].barh(names, [causes[n] for n in names], color="tab:blue")
    axes[0].set_xlabel(f"seconds of the {budget.get('wall_s', 0):.1f} s phase")
    axes[0].invert_yaxis()
    for key, label, color in (("request_latency", "request issue to completion", "tab:green"),
                              ("sleep_latency", "the thread's I/O sleeps", "tab:red")):
        dist = io.get(key) or {}
        hist = dist.get("histogram_ms") or []
        if hist:
            axes[1].step([h[0] for h in hist], [h[1] for h in hist], where="post", color=color, label=label)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("latency, ms (bucket upper bound)")
    axes[1].set_ylabel("count")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend()
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return _save(plt, fig, title or "hostpin time budget (--trace)", path)


def _save(plt, fig, title: str, path: Path | str) -> Path:
    """The title (three lines of 100 are shown: only their text is wrapped, which is quadratic in a
    long word), then the PNG at path."""
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(title[:400], 100)[:3]), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
