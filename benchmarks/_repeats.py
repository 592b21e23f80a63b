"""Repeated latency scenarios: the order of the SDKs in each repeat, and each figure's median and spread.

One run of a latency scenario decides nothing on a shared machine (a stateful pickup p99 went
from 0.78 of the peer's in one run to 1.74 in the next). So each latency scenario runs
``repeats`` times in one invocation, ours and the peer's interleaved (the order flips every
repeat, so neither always runs on a server the other just warmed or loaded), and the report
gives, per figure, the median of the repeats and, per ratio ours/peer, its median and its
min-max over the repeats (each repeat's ratio compares two runs made back to back).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Iterable, List, Optional, Sequence


def order(sdks: Sequence[str], repeat: int) -> List[str]:
    """The SDKs in the order repeat ``repeat`` (0-based) runs them: flipped every other repeat."""
    return list(sdks) if repeat % 2 == 0 else list(reversed(sdks))


def _numbers(values: Iterable[Any]) -> List[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def median(values: Iterable[Any]) -> Optional[float]:
    nums = _numbers(values)
    return statistics.median(nums) if nums else None


def combine(repeats: List[Dict[str, dict]], sdks: Sequence[str]) -> dict:
    """``{"repeats": [...], <sdk>: {field: median}, "ratios": {field: {median, min, max, n}}}``.

    ``repeats`` holds one ``{sdk: result}`` per repeat; a result with an ``error`` is left out of
    the medians (its error is kept in ``errors``).
    """
    out: dict = {"repeats": repeats, "errors": []}
    fields = sorted({k for rep in repeats for r in rep.values() if isinstance(r, dict) for k in r})
    for sdk in sdks:
        rows = [rep.get(sdk) for rep in repeats]
        good = [r for r in rows if isinstance(r, dict) and not r.get("error")]
        out["errors"] += [f"{sdk}: {r['error']}" for r in rows if isinstance(r, dict) and r.get("error")]
        out[sdk] = {f: median(r.get(f) for r in good) for f in fields}
        if not good and rows:
            out[sdk]["error"] = "; ".join(str((r or {}).get("error")) for r in rows)
    if len(sdks) == 2 and "ours" in sdks and "peer" in sdks:
        out["ratios"] = {}
        for f in fields:
            ratios = []
            for rep in repeats:
                ours, peer = rep.get("ours") or {}, rep.get("peer") or {}
                a, b = ours.get(f), peer.get(f)
                if _numbers([a]) and _numbers([b]) and b:
                    ratios.append(float(a) / float(b))
            if ratios:
                out["ratios"][f] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                    "n": len(ratios)}
    return out
