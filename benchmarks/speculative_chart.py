"""The README's speculative-decoding chart: TPOT speedup against batch size, from the results of
``servesim sweep speculative``.

    servesim sweep speculative --out sweeps/speculative
    python benchmarks/speculative_chart.py sweeps/speculative [--png docs/speculative.png]

Writes ``speculative.html`` (plotly, self-contained) into the sweep folder and, with ``--png``, a
screenshot of it taken by headless Chromium (``/usr/bin/chromium``, as the browser tests use).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

BATCH = "deployment.max_num_seqs"
K, ALPHA = "speculative.num_speculative_tokens", "speculative.acceptance.rate"
DASH = {1: "dot", 3: "dash", 5: "solid"}
COLOR = {0.5: "#d62728", 0.7: "#ff7f0e", 0.9: "#2ca02c"}


def speedups(results: pd.DataFrame) -> pd.DataFrame:
    """Each point's mean TPOT speedup over the no-speculation run at the same batch size."""
    plain = results[results[K] == 0].groupby(BATCH)["tpot_s.mean"].first()
    out = results[results[K] > 0][[BATCH, K, ALPHA, "tpot_s.mean"]].copy()
    out["speedup"] = out[BATCH].map(plain) / out["tpot_s.mean"]
    return out.sort_values([ALPHA, K, BATCH])


def figure(table: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for (alpha, k), rows in table.groupby([ALPHA, K]):
        fig.add_trace(go.Scatter(x=rows[BATCH], y=rows["speedup"], mode="lines+markers",
                                 name=f"alpha {alpha}, k = {int(k)}",
                                 line={"color": COLOR.get(alpha), "dash": DASH.get(int(k), "solid")}))
    fig.add_hline(y=1.0, line={"color": "black", "width": 1})
    fig.update_layout(
        title="Speculative decoding (EAGLE-3 head): TPOT speedup over plain decoding<br>"
              "<sup>Llama-3-8B, one H100, prompts 512 / outputs 256 tokens, every request at once</sup>",
        xaxis={"title": "batch size (max_num_seqs, all busy)", "type": "log",
               "tickvals": [1, 4, 16, 64, 256]},
        yaxis={"title": "mean TPOT without / with speculation"}, template="plotly_white",
        width=900, height=520, legend={"x": 1.02, "y": 1})
    return fig


def screenshot(html: Path, png: Path) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                        "--hide-scrollbars", "--window-size=920,540", f"--screenshot={png.resolve()}",
                        html.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    table = speedups(pd.read_parquet(args.sweep / "results.parquet"))
    html = args.sweep / "speculative.html"
    figure(table).write_html(html, include_plotlyjs=True, config={"displayModeBar": False})
    print(table.pivot_table(index=BATCH, columns=[ALPHA, K], values="speedup").round(2).to_string())
    print(f"wrote {html}")
    if args.png is not None:
        screenshot(html, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
