"""The ``--html`` report: one self-contained file (inline CSS and SVG; no script is needed to
read it, and nothing is fetched), drawn from ``Report.to_json``'s data, which it also embeds.

Per log file its format, counts and order; per limit its totals, requests and rejections over
time on a real time axis, the top keys (every column, a timeline each), and per rate the
distribution of per-key peak usage with the candidate and the suggestions marked, and what
each suggestion would do.
"""

from __future__ import annotations

import json
from typing import Any

from . import charts
from .charts import esc
from .render import when
from .report import bucket_seconds

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2733;background:#f7f8fa;
max-width:1180px}
h1{font-size:20px}h2{font-size:16px;margin:0 0 4px}h3{font-size:14px;margin:14px 0 4px}
section{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:14px 18px;
margin:14px 0}
table{border-collapse:collapse;margin:6px 0}
th{text-align:left;font-weight:600;border-bottom:1px solid #c9d0d8}
td,th{padding:3px 12px 3px 0;vertical-align:middle;font-variant-numeric:tabular-nums}
td.n,th.n{text-align:right}.muted{color:#66727f}.bad{color:#b3261e}code{font-size:12px}
svg{display:block;margin:6px 0}.chart text{font-size:11px;fill:#4b5560}
.chart .axis{stroke:#8b96a1;stroke-width:1}.chart .grid{stroke:#e6e9ee;stroke-width:1}
.chart .axis-title{font-size:12px;fill:#1d2733}.chart .legend{font-size:12px;fill:#1d2733}
"""


def page(data: dict[str, Any]) -> str:
    """The whole report as one HTML document."""
    zone = data["zone_offset_seconds"]
    body = [
        "<h1>ratekeeper simulate</h1>",
        f"<p>{data['lines']:,} lines: {data['parsed']:,} requests, "
        f"<span class={'bad' if data['unparsable'] else 'muted'}>{data['unparsable']:,} "
        f"unparsable</span>, {data['other']:,} blank or headers; "
        f"{data['decided']:,} decided, from <b>{esc(when(data['first'], zone))}</b> to "
        f"<b>{esc(when(data['last'], zone))}</b> ({esc(data['zone'])}, the logs' time zone); "
        f"mode <b>{esc(data['mode'])}</b>; suggestions touch at most {data['share']:.2%} of "
        "keys"
        + (
            f", or reject at most {data['reject_share']:.2%} of requests"
            if data.get("reject_share") is not None
            else ""
        )
        + ".</p>",
        _files(data),
    ]
    if data["unparsable_samples"]:
        rows = "".join(
            f"<tr><td>{esc(s['file'])}</td><td class=n>{s['line']:,}</td><td>{esc(s['why'])}</td>"
            f"<td><code>{esc(s['text'][:160])}</code></td></tr>"
            for s in data["unparsable_samples"]
        )
        body.append(
            "<section><h2>Unparsable lines (samples)</h2><table><tr><th>file</th>"
            f"<th class=n>line</th><th>why</th><th>text</th></tr>{rows}</table></section>"
        )
    if data["left_out"]:
        body.append(
            "<p class=muted>Not simulated (they depend on live load): "
            f"{esc(', '.join(data['left_out']))}</p>"
        )
    for i, limit in enumerate(data["limits"]):
        body.append(_limit(i, limit, data))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width'><title>ratekeeper simulate</title>"
        f"<style>{STYLE}</style></head><body>{''.join(body)}"
        f"<script id=report-data type='application/json'>{_json_script(data)}</script>"
        "</body></html>"
    )


def _order(data: dict[str, Any]) -> str:
    """How the lines were put in time order (HTML)."""
    order = data["order"]
    window = f"{order['window_seconds']:,.0f} s"
    if order["sorted"]:
        return (
            f"{order['beyond_window']:,} lines were more than {window} (<code>--skew</code>) "
            "behind the newest line before them, so every line was sorted by time: every "
            "line is decided in its place."
        )
    if order["late"]:
        return (
            f"Lines are put back in time order within {window} and the files merged by time; "
            f"<span class=bad>{order['late']:,} lines came too late for that and were skipped "
            f"(<code>--late skip</code>): this report leaves out {order['late']:,} of "
            f"{data['parsed']:,} requests</span>."
        )
    return (
        f"Lines are put back in time order within {window} and the files merged by time; "
        "every line is decided in its place."
    )


def _files(data: dict[str, Any]) -> str:
    order = data["order"]
    rows = "".join(
        f"<tr><td><code>{esc(f['path'])}</code></td><td>{esc(f['detected'])}</td>"
        f"<td class=n>{f['lines']:,}</td><td class=n>{f['parsed']:,}</td>"
        f"<td class=n>{f['unparsable']:,}</td><td class=n>{f['backward_steps']:,}</td>"
        f"<td class=n>{f['largest_lag_seconds']:,.0f} s</td>"
        f"<td class=n>{f['late'] or f['beyond_window']:,}</td></tr>"
        for f in data["files"]
    )
    late = "".join(
        f"<li>{esc(when(s['time'], data['zone_offset_seconds']))}, "
        f"{s['behind_seconds']:,.0f} s behind: <code>{esc(s['what'][:100])}</code></li>"
        for s in order["late_samples"]
    )
    return (
        "<section class=files><h2>Logs</h2><table><tr><th>file</th><th>detected format</th>"
        "<th class=n>lines</th><th class=n>requests</th><th class=n>unparsable</th>"
        "<th class=n>back in time</th><th class=n>furthest behind</th>"
        "<th class=n>further than --skew</th></tr>"
        f"{rows}</table><p>{_order(data)}</p>" + (f"<ul>{late}</ul>" if late else "") + "</section>"
    )


def _limit(i: int, limit: dict[str, Any], data: dict[str, Any]) -> str:
    zone, zone_name = data["zone_offset_seconds"], data["zone"]
    first, last = data["first"] or 0.0, data["last"] or 0.0
    bucket = bucket_seconds(first, last, 240)
    merged: dict[int, list[int]] = {}
    for p in limit["timeline"]:
        b = merged.setdefault(int(p["minute"]) // bucket * bucket, [0, 0])
        b[0] += p["requests"]
        b[1] += p["would_reject"]
    points = [(float(b), r, x) for b, (r, x) in sorted(merged.items())]
    missing = (
        f"; key <code>{esc(limit['key'])}</code> missing on {limit['key_missing']:,} requests"
        if limit["key_missing"]
        else ""
    )
    return (
        f"<section class=limit id=limit-{i}><h2>{esc(limit['name'])} "
        f"<span class=muted>{esc(limit['rate'])} ({esc(limit['algorithm'])}, keyed by "
        f"{esc(limit['key'])})</span></h2>"
        f"<p>requests <b>{limit['requests']:,}</b>, would reject "
        f"<b class=would-reject>{limit['would_reject']:,}</b> ({limit['share']:.2%} of "
        f"requests); keys {limit['keys']:,}, <b>{limit['keys_rejected']:,}</b> "
        f"({limit['keys_rejected_share']:.2%}) rejected at least once{missing}</p>"
        + charts.timeline(points, first, last, bucket, zone, zone_name)
        + _top(i, limit, data)
        + "".join(_rate(rate, limit) for rate in limit["rates"])
        + "</section>"
    )


def _top(i: int, limit: dict[str, Any], data: dict[str, Any]) -> str:
    if not limit["top_keys"]:
        return "<p class=muted>no key was rejected</p>"
    zone = data["zone_offset_seconds"]
    first, last = data["first"] or 0.0, data["last"] or 0.0
    rows = []
    for t in limit["top_keys"]:
        line = t["timeline"]
        windows = ", ".join(f"{esc(w)} ({n:,})" for w, n in t["windows"].items()) or "-"
        rows.append(
            f"<tr><td><code>{esc(t['key'])}</code></td><td class=n>{t['requests']:,}</td>"
            f"<td class=n>{t['traffic_share']:.2%}</td><td class=n>{t['rejections']:,}</td>"
            f"<td class=n>{t['rejected_share']:.1%}</td>"
            f"<td>{esc(when(t['first_rejected'], zone))}</td>"
            f"<td>{esc(when(t['last_rejected'], zone))}</td><td>{windows}</td><td>"
            + charts.sparkline(
                line["requests"], line["rejections"], first, last, line["bucket_seconds"]
            )
            + "</td></tr>"
        )
    return (
        f"<h3>Top keys by rejections</h3><table class=top-keys id=top-{i}><tr><th>key</th>"
        "<th class=n>requests</th><th class=n>share of traffic</th><th class=n>rejected</th>"
        "<th class=n>of its requests</th><th>first rejected</th><th>last rejected</th>"
        f"<th>rejecting window</th><th>requests / rejections over time</th></tr>{''.join(rows)}"
        "</table>"
    )


def _rate(rate: dict[str, Any], limit: dict[str, Any]) -> str:
    out = []
    window = rate["rate"].split("/")[1]
    for s in rate["suggestions"]:
        peak = " ".join(
            f"{k} <b>{esc('past the largest count' if v is None else f'{v:,}')}</b>"
            for k, v in s["peak"].items()
        )
        outliers = s["outliers"]
        marks = [
            ("candidate", s["candidate"]["count"], f"candidate {rate['rate']}"),
            ("nobody", s["count"], f"touches almost nobody: {s['rate']}"),
        ]
        if outliers is not None:
            marks.append(("outliers", outliers["count"], f"stops the outliers: {outliers['rate']}"))
        bounded = s.get("requests")
        if bounded is not None:
            marks.append(
                ("requests", bounded["count"], f"rejects at most {bounded['bound']:.2%}: "
                 f"{bounded['rate']}")
            )  # fmt: skip
        rows = [_suggestion("touches almost nobody", s, rate["keys"])]
        if bounded is not None:
            kind = f"rejects at most {bounded['bound']:.2%} of requests"
            rows.append(_suggestion(kind, bounded, rate["keys"]))
        if outliers is not None:
            low, high = outliers["gap"]
            gap = f"the bulk peaks at ≤{low:,}, the outliers at ≥{high:,}" if high else ""
            rows.append(_suggestion("stops the outliers", outliers, rate["keys"], gap))
        else:
            rows.append(
                "<tr><td>stops the outliers</td><td colspan=4 class=muted>no group of keys "
                "stands apart from the rest</td></tr>"
            )
        out.append(
            f"<h3>{esc(rate['rate'])} · {esc(s['algorithm'])}</h3>"
            f"<p>peak usage per key per {esc(window)} window: {peak}; the candidate "
            f"({s['candidate']['count']:,}) limits {s['candidate']['limited_keys']:,} of "
            f"{rate['keys']:,} keys</p>"
            + charts.histogram(s["distribution"], marks, window)
            + "<table class=suggestions><tr><th>suggestion</th><th>rate</th>"
            "<th class=n>keys limited</th><th class=n>requests rejected</th><th>keys it stops "
            f"(share of traffic)</th></tr>{''.join(rows)}</table>"
        )
    return "".join(out)


def _suggestion(kind: str, s: dict[str, Any], keys: int, note: str = "") -> str:
    rejected = (
        "-"
        if s["rejected_requests"] is None
        else f"{s['rejected_requests']:,} ({s['rejected_share']:.2%})"
    )
    stops = ", ".join(
        f"<code>{esc(k['key'])}</code> ({k['traffic_share']:.1%})" for k in s["stops"]
    )
    more = s["limited_keys"] - len(s["stops"])
    if more > 0:
        stops += f" and {more:,} more"
    css = {"touches almost nobody": "suggested", "stops the outliers": "outliers"}.get(
        kind, "bounded"
    )
    return (
        f"<tr><td>{esc(kind)}</td><td><b class={css}>{esc(s['rate'] or 'none')}</b>"
        + (f"<br><span class=muted>{esc(note)}</span>" if note else "")
        + f"</td><td class=n>{s['limited_keys']:,} of {keys:,}</td><td class=n>{rejected}</td>"
        f"<td>{stops or '-'}</td></tr>"
    )


def _json_script(data: dict[str, Any]) -> str:
    text = json.dumps(data, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
