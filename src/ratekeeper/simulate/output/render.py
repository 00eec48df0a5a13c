"""The terminal summary, drawn from ``Report.to_json``'s data only (what ``--json`` prints),
so the two say the same. Times are shown in the logs' own time zone, which is named."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any


def when(t: float | None, offset: int, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Epoch seconds as text in the zone ``offset`` seconds east of UTC."""
    if t is None:
        return "-"
    zone = UTC if offset == 0 else timezone(timedelta(seconds=offset))
    return datetime.fromtimestamp(t, zone).strftime(fmt)


def num(x: Any) -> str:
    if x is None:
        return "-"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


def detected(data: dict[str, Any]) -> list[str]:
    """One line per log file: the format it was read in and how it was told."""
    return [f"detected format: {f['detected']} in {f['path']}" for f in data["files"]]


def text(data: dict[str, Any]) -> str:
    """A readable summary: what was read, its order, then one block per limit."""
    zone = data["zone_offset_seconds"]
    out = [
        f"read {data['lines']:,} lines ({data['parsed']:,} requests, "
        f"{data['unparsable']:,} unparsable, {data['other']:,} blank or headers) in "
        f"{data['seconds']:.2f} s"
        + (f" ({data['lines_per_second']:,} lines/s)" if data["lines_per_second"] else ""),
        *detected(data),
        f"from {when(data['first'], zone)} to {when(data['last'], zone)} ({data['zone']}); "
        f"mode: {data['mode']}",
    ]
    out.append(order_line(data))
    for s in data["order"]["late_samples"]:
        out.append(
            f"  late line at {when(s['time'], zone)}, {s['behind_seconds']:,.0f} s behind: "
            f"{s['what'][:60]!r}"
        )
    for s in data["unparsable_samples"]:
        out.append(f"  unparsable line {s['line']} of {s['file']}: {s['why']}: {s['text'][:80]!r}")
    if data["left_out"]:
        out.append("not simulated (they depend on live load): " + ", ".join(data["left_out"]))
    for limit in data["limits"]:
        out.extend(_limit(limit, zone, data["share"]))
    return "\n".join(out) + "\n"


def order_line(data: dict[str, Any]) -> str:
    """How far from time order the logs were, and how they were put back in it."""
    order = data["order"]
    text = (
        f"order: {order['backward_steps']:,} lines earlier than the line before them "
        f"(the furthest {order['largest_lag_seconds']:,.0f} s behind); "
    )
    window = f"{order['window_seconds']:,.0f} s"
    if order["sorted"]:
        written = order["sort_temporary_bytes"]
        return text + (
            f"{order['beyond_window']:,} more than --skew ({window}) behind, so every line "
            "was sorted by time"
            + (f" ({written / 1e6:,.1f} MB of temporary files)" if written else " (in memory)")
        )
    if order["late"]:
        return text + (
            f"put back in time order within {window}; {order['late']:,} came too late for "
            f"that and were skipped (--late skip): this report leaves out {order['late']:,} "
            f"of {data['parsed']:,} requests"
        )
    return text + f"put back in time order within {window}"


def _limit(limit: dict[str, Any], zone: int, share: float) -> list[str]:
    out = [
        "",
        f"{limit['name']}  {limit['rate']}  ({limit['algorithm']}, keyed by {limit['key']})",
        f"  requests {limit['requests']:,}   would reject {limit['would_reject']:,} "
        f"({limit['share']:.2%})   keys {limit['keys']:,}, {limit['keys_rejected']:,} of them "
        f"({limit['keys_rejected_share']:.2%}) rejected at least once",
    ]
    if limit["key_missing"]:
        out.append(f"  key {limit['key']!r} missing on {limit['key_missing']:,} requests")
    if limit["top_keys"]:
        out.append(
            f"  {'top keys':<24} {'requests':>10} {'traffic':>8} {'rejected':>10} "
            f"{'of its':>7}  {'first rejected':<19}  {'last rejected':<19}  window"
        )
        for t in limit["top_keys"]:
            windows = ", ".join(f"{w} ({n:,})" for w, n in t["windows"].items()) or "-"
            out.append(
                f"  {t['key'][:24]:<24} {t['requests']:>10,} {t['traffic_share']:>8.2%} "
                f"{t['rejections']:>10,} {t['rejected_share']:>7.1%}  "
                f"{when(t['first_rejected'], zone):<19}  {when(t['last_rejected'], zone):<19}  "
                f"{windows}"
            )
    for rate in limit["rates"]:
        peak = rate["peak"]
        window = rate["rate"].split("/")[1]
        if peak:
            out.append(
                f"  peak per key per {window} window: p50 {num(peak['p50'])}  p90 "
                f"{num(peak['p90'])}  p99 {num(peak['p99'])}  max {num(peak['max'])}"
            )
        for s in rate["suggestions"]:
            out.append(
                f"  suggested for {rate['rate']} ({s['algorithm']}); the candidate's "
                f"{s['candidate']['count']:,} limits {s['candidate']['limited_keys']:,} of "
                f"{rate['keys']:,} keys:"
            )
            out.append("    touches almost nobody: " + _suggestion(s, rate["keys"], share))
            bounded = s.get("requests")
            if bounded is not None:
                out.append(
                    f"    rejects at most {bounded['bound']:.2%} of requests: "
                    + _suggestion(bounded, rate["keys"])
                )
            if s["outliers"] is not None:
                low, high = s["outliers"]["gap"]
                out.append(
                    f"    stops the outliers: {_suggestion(s['outliers'], rate['keys'])} "
                    f"(the bulk peaks at {low:,} or less, the outliers at "
                    f"{'more than the algorithm counts' if high is None else f'{high:,} or more'})"
                )
            else:
                out.append("    stops the outliers: none stand apart from the rest")
    return out


def _suggestion(s: dict[str, Any], keys: int, share: float | None = None) -> str:
    if s["rate"] is None:
        return "no rate the algorithm accepts"
    text = f"{s['rate']} -> limits {s['limited_keys']:,} of {keys:,} keys"
    if share is not None:
        text += f" (at most {share:.2%})"
    if s["rejected_requests"] is not None:
        text += f", rejects {s['rejected_requests']:,} requests ({s['rejected_share']:.2%})"
    if s["stops"]:
        named = ", ".join(
            f"{k['key']} ({k['traffic_share']:.1%} of traffic)" for k in s["stops"][:5]
        )
        more = s["limited_keys"] - min(5, len(s["stops"]))
        text += f"; stops {named}" + (f" and {more:,} more" if more > 0 else "")
    return text
