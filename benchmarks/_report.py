"""Renders the benchmark results as markdown (printed and written to results.md)."""

from __future__ import annotations

from typing import Any, List, Optional


_SERVER_LABEL = {"sqlite": "one SQLite node", "redis": "one Redis-backed node",
                 "cluster": "two Redis-backed nodes behind a balancer"}


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:.{digits}f}"
    return str(value)


def _ratio(ours: Any, peer: Any) -> str:
    if not isinstance(ours, (int, float)) or not isinstance(peer, (int, float)) or not peer:
        return "—"
    return f"{ours / peer:.2f}"


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _pair_rows(block: dict, rows: "list[tuple[str, tuple, int]]") -> List[str]:
    repeated = isinstance(block.get("repeats"), list)
    if repeated:
        k = len(block["repeats"])
        out = [f"| | ours (median of {k}) | peer (median of {k}) | ours/peer: median (min–max of {k}) |",
               "|---|---:|---:|---:|"]
    else:
        out = ["| | ours | peer | ours/peer |", "|---|---:|---:|---:|"]
    for label, path, digits in rows:
        ours, peer = _get(block, "ours", *path), _get(block, "peer", *path)
        ratio = _ratio(ours, peer)
        spread = _get(block, "ratios", *path) if repeated and len(path) == 1 else None
        if isinstance(spread, dict):
            ratio = f"{spread['median']:.2f} ({spread['min']:.2f}–{spread['max']:.2f})"
        out.append(f"| {label} | {_num(ours, digits)} | {_num(peer, digits)} | {ratio} |")
    for sdk in ("ours", "peer"):
        if _get(block, sdk, "error"):
            out.append(f"\n{sdk}: error: {block[sdk]['error']}")
    for err in block.get("errors") or ():
        out.append(f"\n- a repeat failed: {err}")
    return out


def render(results: dict) -> str:
    env = results.get("env", {})
    lines = [
        "# conductor-agents vs the peer SDK (conductor-agent-sdk 0.4.4)",
        "",
        f"{results.get('mode')} run, {env.get('started')}; server {env.get('server_version')} "
        f"({_SERVER_LABEL.get(_get(results, 'settings', 'server') or 'sqlite')}, one for both SDKs); "
        f"latency scenarios repeated {_get(results, 'settings', 'repeats') or 1} times, the SDKs interleaved; "
        f"{env.get('cores')} cores, load average {_load(env.get('loadavg_start'))} at start, "
        f"{_load(env.get('loadavg_end'))} at end (the machine is shared: compare the ratios). "
        "Ratio = ours / peer (lower is better for latency, memory, CPU, requests).",
        "",
    ]
    for key, title in (("pickup_stateful", "Tool pickup latency, stateful runs"),
                       ("pickup_plain", "Tool pickup latency, non-stateful runs")):
        if key in results:
            block = results[key]
            lines += [f"## {title} (server clock: scheduledTime → startTime, ms)", "",
                      "Meanwhile the harness asks the server every 50 ms for a task of a type nobody schedules "
                      "(`timeout=0`): no SDK picks a task up faster than the server answers such a poll.", ""]
            lines += _pair_rows(block, [
                ("tool calls", ("calls",), 0), ("p50", ("p50",), 0), ("p95", ("p95",), 0), ("p99", ("p99",), 0),
                ("first call of a run (p50; left out above)", ("first_call_ms",), 0),
                ("server's answer to an empty poll meanwhile, p50", ("empty_poll_p50_ms",), 0),
                ("server's answer to an empty poll meanwhile, p99", ("empty_poll_p99_ms",), 0)])
            lines.append("")
    if "roundtrip" in results:
        lines += ["## Message round trip (send_message → tool body starts, host clock, ms)", ""]
        lines += _pair_rows(results["roundtrip"], [("messages", ("messages",), 0), ("p50", ("p50",), 0), ("p95", ("p95",), 0),
                                    ("p99", ("p99",), 0), ("no answer within 30 s", ("missing",), 0)])
        lines.append("")
    if "cost" in results:
        lines += ["## Idle cost (requests per second per idle stateful run, counted by a proxy)", ""]
        kinds = sorted({k for v in results["cost"].values() for k in (v.get("by_kind") or {})})
        lines += _pair_rows(results["cost"], [("idle runs", ("runs",), 0), ("all requests", ("req_per_s_per_run",), 2)]
                            + [(f"· {k}", ("by_kind", k), 2) for k in kinds])
        lines.append("")
    if "live" in results:
        lines += _live(results["live"])
    lines += _goals(results)
    return "\n".join(lines) + "\n"


def _load(value: Any) -> str:
    return "/".join(f"{x:.1f}" for x in value) if value else "?"


def _live(live: dict) -> List[str]:
    lines = ["## Live stateful runs in one process (each cell: ours / peer)", "",
             "Idle window: client CPU is the driver process and its children (utime+stime), server CPU the Conductor "
             "JVM(s); idle req/s = requests per second per run the server answered in the window (its own counters, "
             "`/actuator/prometheus`; the harness's status probes left out); status = latency of "
             "`GET /agent/{id}/status` during the window. Answered = runs whose tool "
             "started within 2 s of their message; one message per run, sent round-robin at a fixed rate (see "
             "settings). Each answer is split on the server's clock: *server path* = message sent → the tool task "
             "scheduled (the server's message check, join and LLM turn: no SDK is involved), *pickup* = scheduled → "
             "started (the SDK).", "",
             "| N | started | start all (s) | RSS MB | PSS MB | threads | processes | client CPU % | idle req/s per run | "
             "server CPU % | status p50/max ms | answered ≤2 s | answer max s | server path p50/max s | "
             "pickup p50/p99/max ms |",
             "|---:|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ns = sorted({int(n) for per in live.values() for n in per}, key=int)
    for n in ns:
        def cell(field: str, digits: int = 0) -> str:
            vals = []
            for sdk in ("ours", "peer"):
                r = live.get(sdk, {}).get(str(n))
                if r is None:
                    vals.append("—")
                elif r.get("skipped") or r.get("error"):
                    vals.append("stopped" if r.get("skipped") else "error")
                else:
                    vals.append(_num(r.get(field), digits))
            return " / ".join(vals)

        def status() -> str:
            vals = []
            for sdk in ("ours", "peer"):
                r = live.get(sdk, {}).get(str(n)) or {}
                s = r.get("status_ms") or {}
                vals.append(f"{_num(s.get('p50'))}/{_num(s.get('max'))}" if s else "—")
            return " / ".join(vals)

        def split(*fields: str, digits: int = 0) -> str:
            vals = []
            for sdk in ("ours", "peer"):
                r = live.get(sdk, {}).get(str(n)) or {}
                vals.append("/".join(_num(r.get(f), digits) for f in fields))
            return " / ".join(vals)

        lines.append(f"| {n} | {cell('started')} | {cell('start_s', 1)} | {cell('rss_mb')} | {cell('pss_mb')} | "
                     f"{cell('threads')} | {cell('processes')} | {cell('client_cpu_pct', 1)} | "
                     f"{cell('idle_req_per_s_per_run', 3)} | "
                     f"{cell('server_cpu_pct', 1)} | {status()} | {cell('answered_2s')} | {cell('answer_max_s', 2)} | "
                     f"{split('server_path_p50_s', 'server_path_max_s', digits=2)} | "
                     f"{split('answer_pickup_p50_ms', 'answer_pickup_p99_ms', 'answer_pickup_max_ms')} |")
    lines.append("")
    for sdk in ("ours", "peer"):
        held = [int(n) for n, r in live.get(sdk, {}).items() if r.get("holds")]
        notes = [f"N={n}: {r.get('stopped') or r.get('error') or r.get('skipped')}"
                 for n, r in live.get(sdk, {}).items() if r.get("stopped") or r.get("error")]
        lines.append(f"- {sdk}: largest N held (all started, all answered within 2 s): {max(held) if held else 'none'}"
                     + (f"; {'; '.join(notes)}" if notes else ""))
    lines.append("")
    return lines


def _goals(results: dict) -> List[str]:
    lines = ["## Goals", ""]

    def check(label: str, ok: Optional[bool], figure: str) -> None:
        mark = "—" if ok is None else ("met" if ok else "NOT met")
        lines.append(f"- {label}: **{mark}** ({figure})")

    for key, name in (("pickup_stateful", "stateful"), ("pickup_plain", "non-stateful")):
        ours, peer = _get(results, key, "ours", "p50"), _get(results, key, "peer", "p50")
        if isinstance(ours, (int, float)) and isinstance(peer, (int, float)):
            check(f"pickup p50 ≤ half the peer's ({name})", ours <= peer / 2, f"{ours:.0f} ms vs {peer:.0f} ms")
        p99 = _get(results, key, "ours", "p99")
        if isinstance(p99, (int, float)):
            check(f"pickup p99 < 100 ms ({name})", p99 < 100, f"{p99:.0f} ms")
    for key, name in (("pickup_stateful", "stateful"),):
        for field in ("p50", "p99"):
            spread = _get(results, key, "ratios", field)
            if isinstance(spread, dict):
                check(f"{name} pickup {field} ratio ours/peer < 1.0 (median of {spread['n']} interleaved repeats)",
                      spread["median"] < 1.0,
                      f"median {spread['median']:.2f}, spread {spread['min']:.2f}–{spread['max']:.2f}")
    r1000 = _get(results, "live", "ours", "1000")
    if isinstance(r1000, dict) and not r1000.get("error") and not r1000.get("skipped"):
        check("1000 runs: all started", r1000.get("started") == 1000, f"{r1000.get('started')}")
        check("1000 runs: RSS < 200 MB", (r1000.get("rss_mb") or 1e9) < 200, f"{_num(r1000.get('rss_mb'))} MB")
        check("1000 runs: threads < 1100", (r1000.get("threads") or 1e9) < 1100, f"{_num(r1000.get('threads'))}")
        check("1000 runs: idle client CPU < 5% of a core", (r1000.get("client_cpu_pct") or 1e9) < 5,
              f"{_num(r1000.get('client_cpu_pct'), 1)}%")
        check("1000 runs: idle requests ≤ 0.1/s per run", (r1000.get("idle_req_per_s_per_run") or 1e9) <= 0.1,
              f"{_num(r1000.get('idle_req_per_s_per_run'), 3)}/s")
    peer_n = [int(n) for n, r in (_get(results, "live", "peer") or {}).items()
              if isinstance(r, dict) and r.get("started") and not r.get("skipped")]
    if peer_n:
        lines.append(f"- the peer's largest N measured: {max(peer_n)}")
    r200 = _get(results, "live", "ours", "200")
    if isinstance(r200, dict) and not r200.get("error"):
        check("200 runs: RSS < 300 MB", r200.get("rss_mb", 1e9) < 300, f"{_num(r200.get('rss_mb'))} MB")
        check("200 runs: every run answers within 2 s", r200.get("answered_2s") == 200,
              f"{r200.get('answered_2s')}/200, max {_num(r200.get('answer_max_s'), 2)} s; of which the server path "
              f"p50/max {_num(r200.get('server_path_p50_s'), 2)}/{_num(r200.get('server_path_max_s'), 2)} s and "
              f"the SDK's pickup p50/p99/max {_num(r200.get('answer_pickup_p50_ms'))}/"
              f"{_num(r200.get('answer_pickup_p99_ms'))}/{_num(r200.get('answer_pickup_max_ms'))} ms")
        check("200 runs: idle client CPU < 5% of a core", r200.get("client_cpu_pct", 1e9) < 5,
              f"{_num(r200.get('client_cpu_pct'), 1)}%")
    else:
        lines.append("- 200-run goals: not measured in this run (use the full run)")
    lines.append("")
    return lines
