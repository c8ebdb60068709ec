"""`halo plot RUN_DIR [RUN_DIR2]`: a run's curves as one PNG, from its metrics.jsonl.

Loss (and eval loss), learning rate, gradient norm and throughput for every method; reward for
GRPO and accuracy for classification when the run recorded them. A second run is drawn on the
same axes, to compare. matplotlib's Agg backend: no display is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from halo.errors import HaloError

METRICS = "metrics.jsonl"
# (title, [(key, style)]): a panel is drawn when one of its keys was recorded; the first four
# are always drawn (a run that lacks one says so in its panel).
PANELS: list[tuple[str, list[str]]] = [
    ("loss", ["loss", "eval_loss"]),
    ("learning rate", ["lr"]),
    ("gradient norm", ["grad_norm"]),
    ("throughput (tokens/s)", ["tokens_per_s"]),
    ("reward", ["reward", "eval_reward"]),
    ("accuracy", ["accuracy", "eval_accuracy", "train_accuracy"]),
]
ALWAYS = 4

Series = dict[str, dict[int, float]]  # key -> step -> value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw a run's loss, lr, grad norm and throughput (and reward, accuracy) as a PNG",
        description="Read RUN_DIR/metrics.jsonl (a run's log folder, <logs>/<job>) and write a "
        "PNG; a second run is drawn on the same axes.",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="one or two runs")
    p.add_argument("-o", "--output", type=Path, help="the PNG (default RUN_DIR/metrics.png)")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    if len(args.runs) > 2:
        raise HaloError(f"plot: one or two runs, got {len(args.runs)}")
    out = args.output or _folder(args.runs[0]) / "metrics.png"
    plot(args.runs, out)
    print(out)
    return 0


def _folder(run: Path) -> Path:
    return run.parent if run.name == METRICS else run


def read(run: Path) -> Series:
    """Every numeric value of a run's metrics.jsonl by key and step (a step logged twice, as
    after a resume that redid steps, keeps its last value)."""
    path = run if run.name == METRICS else run / METRICS
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HaloError(f"{run}: no {METRICS} (give a run's log folder, <logs>/<job>)") from None
    except UnicodeDecodeError:
        raise HaloError(f"{path}: not UTF-8 text") from None
    series: Series = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise HaloError(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise HaloError(f"{path}:{n}: expected a JSON object with an integer step")
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                series.setdefault(key, {})[row["step"]] = float(value)
    if not series:
        raise HaloError(f"{path}: no metrics recorded yet")
    return series


def _labels(runs: list[Path]) -> list[str]:
    """Each run's folder name, with as many parent folders as it takes to tell them apart."""
    parts = [_folder(r).resolve().parts for r in runs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(_folder(r)) for r in runs]


def panels(data: list[Series]) -> list[str]:
    """The panels' titles for these runs: the first four always, the others when recorded."""
    return [
        title
        for i, (title, keys) in enumerate(PANELS)
        if i < ALWAYS or any(k in d for d in data for k in keys)
    ]


def plot(runs: list[Path], out: Path) -> None:
    """Write the PNG of ``runs`` (one or two) to ``out``, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    data = [read(r) for r in runs]
    labels = _labels(runs)
    titles = panels(data)
    chosen = [(title, keys) for title, keys in PANELS if title in titles]
    cols = 2
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.3 * rows), squeeze=False)
    colors = ["tab:blue", "tab:orange"]
    for ax, (title, keys) in zip(axes.flat, chosen, strict=False):
        drawn = False
        for d, label, color in zip(data, labels, colors, strict=False):
            for k in keys:
                if k not in d:
                    continue
                steps = sorted(d[k])
                evaluation = k.startswith("eval_")
                ax.plot(
                    steps,
                    [d[k][s] for s in steps],
                    color=color,
                    linestyle="--" if evaluation else "-",
                    marker="o" if evaluation or len(steps) == 1 else None,
                    markersize=3,
                    label=f"{label}: {k}" if len(keys) > 1 or len(data) > 1 else None,
                )
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if drawn and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(chosen) :]:
        ax.set_visible(False)
    fig.suptitle(" vs ".join(labels))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        # No software/date metadata: the same metrics draw the same bytes.
        fig.savefig(tmp, format="png", dpi=90, metadata={"Software": None})
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
