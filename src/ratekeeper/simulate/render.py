"""The terminal summary of a ``Report`` (``--json`` prints ``Report.to_json`` instead)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .replay import Report


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(x: Any) -> str:
    if x is None:
        return "-"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


def text(report: Report) -> str:
    """A readable summary: what was read, then one block per limit."""
    data = report.to_json()
    out = [
        f"read {data['lines']:,} lines ({data['parsed']:,} requests, "
        f"{data['unparsable']:,} unparsable) in {data['seconds']:.2f} s"
        + (f" ({data['lines_per_second']:,} lines/s)" if data["lines_per_second"] else ""),
        f"from {_when(data['first'])} to {_when(data['last'])}; mode: {data['mode']}",
    ]
    for n, line, why in report.log.samples:
        out.append(f"  unparsable line {n}: {why}: {line[:80]!r}")
    if data["left_out"]:
        out.append("not simulated (they depend on live load): " + ", ".join(data["left_out"]))
    for limit in data["limits"]:
        out.append("")
        out.append(f"{limit['name']}  {limit['rate']}  ({limit['algorithm']})")
        out.append(
            f"  requests {limit['requests']:,}   would reject {limit['would_reject']:,} "
            f"({limit['share']:.2%})   keys {limit['keys']:,}, "
            f"{limit['keys_rejected']:,} of them rejected at least once"
        )
        if limit["top_keys"]:
            top = ", ".join(f"{t['key']} ({t['rejections']:,})" for t in limit["top_keys"][:5])
            out.append(f"  top rejected keys: {top}")
        for rate in limit["rates"]:
            peak = rate["peak"]
            if peak:
                out.append(
                    f"  peak per key per {rate['rate'].split('/')[1]} window: "
                    f"p50 {_num(peak['p50'])}  p90 {_num(peak['p90'])}  "
                    f"p99 {_num(peak['p99'])}  max {_num(peak['max'])}"
                )
            for s in rate["suggestions"]:
                what = s["rate"] or "no rate the algorithm accepts"
                out.append(
                    f"  suggested ({s['algorithm']}, at most {report.share:.2%} of keys "
                    f"limited): {what} -> limits {s['limited_keys']:,} of {rate['keys']:,} keys"
                )
    return "\n".join(out) + "\n"
