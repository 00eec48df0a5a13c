"""The ``--html`` report: one self-contained file (inline CSS, SVG and a little JS; no network).

Charts are drawn here as SVG: per limit, requests and would-be rejections per minute, and the
distribution of per-key peak usage (keys per power-of-two bin) with the suggested limit.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import Any

from .replay import Report

W, H, PAD = 640, 180, 36

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2733;background:#f7f8fa}
h1{font-size:20px}h2{font-size:16px;margin:0 0 4px}section{background:#fff;border:1px solid #dde2e8;
border-radius:6px;padding:14px 18px;margin:14px 0}table{border-collapse:collapse}
td,th{padding:2px 10px 2px 0;text-align:left;font-variant-numeric:tabular-nums}
.muted{color:#66727f}.bad{color:#b3261e}svg{display:block;margin:6px 0}
.bar{fill:#7aa6d8}.rej{fill:#d9534f}.axis{stroke:#99a3ad;stroke-width:1}
.mark{stroke:#2e7d32;stroke-width:2;stroke-dasharray:4 3}text{font-size:11px;fill:#4b5560}
"""

SCRIPT = """
document.querySelectorAll('[data-toggle]').forEach(function (b) {
  b.addEventListener('click', function () {
    var t = document.getElementById(b.getAttribute('data-toggle'));
    t.hidden = !t.hidden;
  });
});
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M")


def timeline_svg(points: list[dict[str, Any]]) -> str:
    """Requests (blue) and would-be rejections (red) per minute."""
    if not points:
        return "<p class=muted>no requests</p>"
    top = max(p["requests"] for p in points) or 1
    n = len(points)
    bw = (W - PAD) / n
    parts = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">']
    for i, p in enumerate(points):
        x = PAD + i * bw
        h = (H - 24) * p["requests"] / top
        r = (H - 24) * p["would_reject"] / top
        label = f"{_time(p['minute'])}: {p['requests']} requests, {p['would_reject']} rejected"
        parts.append(
            f'<g><title>{_esc(label)}</title><rect class=bar x="{x:.1f}" y="{H - 20 - h:.1f}" '
            f'width="{max(bw - 1, 1):.1f}" height="{h:.1f}"/><rect class=rej x="{x:.1f}" '
            f'y="{H - 20 - r:.1f}" width="{max(bw - 1, 1):.1f}" height="{r:.1f}"/></g>'
        )
    parts.append(f'<line class=axis x1="{PAD}" y1="{H - 20}" x2="{W}" y2="{H - 20}"/>')
    parts.append(f'<text x="0" y="12">{top}/min</text>')
    parts.append(f'<text x="{PAD}" y="{H - 5}">{_time(points[0]["minute"])}</text>')
    parts.append(f'<text x="{W - 40}" y="{H - 5}">{_time(points[-1]["minute"])}</text>')
    return "".join(parts) + "</svg>"


def distribution_svg(bins: list[list[Any]], suggested: int | None) -> str:
    """Keys per peak-usage bin (log2), with the suggested count marked."""
    if not bins:
        return "<p class=muted>no keys</p>"
    top = max(c for _, c in bins) or 1
    n = len(bins)
    bw = (W - PAD) / n
    parts = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">']
    for i, (bound, count) in enumerate(bins):
        x = PAD + i * bw
        h = (H - 24) * count / top
        name = "more" if bound is None else f"≤{int(bound)}"
        parts.append(
            f"<g><title>{_esc(f'{int(count)} keys peaked at {name}')}</title><rect class=bar "
            f'x="{x:.1f}" y="{H - 20 - h:.1f}" width="{max(bw - 2, 1):.1f}" height="{h:.1f}"/>'
            f'<text x="{x:.1f}" y="{H - 5}">{_esc(name)}</text></g>'
        )
        if suggested is not None and bound is not None:
            low = bound / 2 if bound > 1 else 0
            if low < suggested <= bound:
                sx = x + bw * (suggested - low) / (bound - low)
                parts.append(f'<line class=mark x1="{sx:.1f}" y1="0" x2="{sx:.1f}" y2="{H - 20}"/>')
    parts.append(f'<text x="0" y="12">{int(top)} keys</text>')
    return "".join(parts) + "</svg>"


def page(report: Report) -> str:
    """The whole report as one HTML document."""
    data = report.to_json()
    body = [
        "<h1>ratekeeper simulate</h1>",
        f"<p>{data['lines']:,} lines, {data['parsed']:,} requests, "
        f"<span class={'bad' if data['unparsable'] else 'muted'}>{data['unparsable']:,} "
        f"unparsable</span>; mode <b>{_esc(data['mode'])}</b>; suggestions limit at most "
        f"{report.share:.2%} of keys.</p>",
    ]
    if data["unparsable_samples"]:
        rows = "".join(
            f"<tr><td>{s['line']}</td><td>{_esc(s['why'])}</td><td><code>{_esc(s['text'])}"
            "</code></td></tr>"
            for s in data["unparsable_samples"]
        )
        body.append(f"<section><h2>Unparsable lines (samples)</h2><table>{rows}</table></section>")
    for i, limit in enumerate(data["limits"]):
        body.append(_limit_section(i, limit))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width'><title>ratekeeper simulate</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}"
        f"<script id=report-data type='application/json'>{_json_script(data)}</script>"
        f"<script>{SCRIPT}</script></body></html>"
    )


def _limit_section(i: int, limit: dict[str, Any]) -> str:
    top = "".join(
        f"<tr><td><code>{_esc(t['key'])}</code></td><td>{t['rejections']:,}</td></tr>"
        for t in limit["top_keys"]
    )
    rates = []
    for rate in limit["rates"]:
        for s in rate["suggestions"]:
            stats = " ".join(
                f"{k} <b>{_esc('past the largest count' if v is None else v)}</b>"
                for k, v in s["peak"].items()
            )
            rates.append(
                f"<h3>{_esc(rate['rate'])} · {_esc(s['algorithm'])}</h3>"
                f"<p>peak usage per key per window: {stats}<br>suggested: "
                f"<b class=suggested>{_esc(s['rate'] or 'none')}</b> (limits "
                f"{s['limited_keys']:,} of {rate['keys']:,} keys)</p>"
                + distribution_svg(s["distribution"], s["count"])
            )
    return (
        f"<section class=limit id=limit-{i}><h2>{_esc(limit['name'])} "
        f"<span class=muted>{_esc(limit['rate'])} ({_esc(limit['algorithm'])})</span></h2>"
        f"<p>requests <b>{limit['requests']:,}</b>, would reject "
        f"<b class=would-reject>{limit['would_reject']:,}</b> ({limit['share']:.2%}); "
        f"keys {limit['keys']:,}, {limit['keys_rejected']:,} rejected at least once</p>"
        f"{timeline_svg(limit['timeline'])}"
        f"<button data-toggle=top-{i}>top rejected keys</button>"
        f"<table id=top-{i} hidden>{top}</table>{''.join(rates)}</section>"
    )


def _json_script(data: dict[str, Any]) -> str:
    text = json.dumps(data, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
