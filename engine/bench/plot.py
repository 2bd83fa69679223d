"""PNG charts of ``folio bench`` results (``--plot DIR``), one per workload.

matplotlib is an optional extra (``pip install 'folio[plot]'``); ``plot_results`` raises
ImportError without it and the CLI says so.
"""

from __future__ import annotations

from pathlib import Path

SIDES = {"folio": "Folio", "hf_recompute": "transformers (recompute)",
         "hf_cache": "transformers (DynamicCache)", "hf": "transformers",
         "hf_sequential": "transformers (one chat at a time)", "llama_cpp": "llama.cpp (GGUF)"}


def _sides(rows: list[dict], suffix: str) -> list[str]:
    """The sides that have a ``<side><suffix>`` column, in SIDES order."""
    keys = set().union(*(row.keys() for row in rows)) if rows else set()
    return [side for side in SIDES if f"{side}{suffix}" in keys]


def _chat(result: dict, plt):
    rows = result["rows"]
    turns = [row["turn"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for side in _sides(rows, "_ttft_ms"):
        left.plot(turns, [row[f"{side}_ttft_ms"] for row in rows], marker="o",
                  label=SIDES[side])
        right.plot(turns, [row[f"{side}_computed"] for row in rows], marker="o",
                   label=SIDES[side])
    left.set(title="Time to first token per turn", xlabel="turn", ylabel="ms", xticks=turns)
    right.set(title="Prompt tokens computed per turn", xlabel="turn", ylabel="tokens",
              xticks=turns)
    left.legend()
    return fig


def _candidates(result: dict, plt):
    rows = result["rows"]
    ns = [row["n"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(ns, [row["folio_wall_s"] for row in rows], marker="o", label="Folio")
    left.plot(ns, [row["hf_wall_s"] for row in rows], marker="o",
              label="transformers (num_return_sequences)")
    mib = 2**20
    right.plot(ns, [row["folio_kv_bytes"] / mib for row in rows], marker="o",
               label="Folio (shared prompt)")
    right.plot(ns, [row["hf_kv_bytes"] / mib for row in rows], marker="o", label="transformers")
    if "separate_copies_kv_bytes" in rows[0]:
        right.plot(ns, [row["separate_copies_kv_bytes"] / mib for row in rows],
                   linestyle="--", label="n separate copies")
    left.set(title="Wall time for n candidates", xlabel="n", ylabel="s", xticks=ns)
    right.set(title="KV cache bytes", xlabel="n", ylabel="MiB", xticks=ns)
    left.legend()
    right.legend()
    return fig


def _bars(ax, rows: list[dict], label_key: str, suffix: str) -> None:
    sides = _sides(rows, suffix)
    width = 0.8 / max(len(sides), 1)
    for i, side in enumerate(sides):
        xs = [k + i * width for k in range(len(rows))]
        ax.bar(xs, [row.get(f"{side}{suffix}", 0) for row in rows], width, label=SIDES[side])
    ax.set_xticks([k + width * (len(sides) - 1) / 2 for k in range(len(rows))],
                  [str(row[label_key]) for row in rows])
    ax.legend()


def _decode(result: dict, plt):
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, result["rows"], "context", "_tok_s")
    ax.set(title="Single-stream decode", xlabel="context (tokens)", ylabel="tokens / s")
    return fig


def _concurrent(result: dict, plt):
    fig, ax = plt.subplots(figsize=(9, 4))
    _bars(ax, result["rows"], "chat", "_ttft_ms")
    ax.set(title="Time to first token, all chats submitted at once", xlabel="chat",
           ylabel="ms")
    return fig


def _waste(result: dict, plt):
    series = [100 * w for w in result["summary"]["waste_series"]]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(range(1, len(series) + 1), series, label="internal waste")
    for target in result["targets"]:
        ax.axhline(target["limit"], linestyle="--", color="gray", label="target (mean)")
    ax.set(title="KV slots allocated but empty, during the chat", xlabel="engine step",
           ylabel="%")
    ax.legend()
    return fig


CHARTS = {"chat": _chat, "candidates": _candidates, "decode": _decode,
          "concurrent": _concurrent, "waste": _waste}


def plot_results(results: dict[str, dict], folder: str | Path) -> list[Path]:
    """Write ``<workload>.png`` into ``folder`` for each result that has a chart."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, result in results.items():
        chart = CHARTS.get(name)
        if chart is None or not result["rows"]:
            continue
        fig = chart(result, plt)
        fig.suptitle(f"folio bench {name}: {Path(result['setup']['model']).name}, "
                     f"{result['setup']['threads']} threads")
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
