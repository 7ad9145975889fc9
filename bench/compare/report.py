"""Turn a run's results into ``README.md`` (tables, targets, conclusions), ``results.json``
(summaries, no raw latencies) and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

RAY = "Ray Serve"
MPX = "Modelplex"
SYSTEMS = (RAY, MPX)
COLORS = {RAY: "#1f77b4", MPX: "#d62728"}


def _f(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(a, b) -> float:
    return a / b if a is not None and b else float("nan")


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or ("l" + "r" * (len(headers) - 1))
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def bound_batch(mode: str, concurrency: int, max_batch: int) -> int:
    """The batch size the compute bound is read at: 1 unbatched, else min(concurrency, max batch)."""
    return 1 if mode == "unbatched" else min(concurrency, max_batch)


def _bound_rows(results: dict, batch: int) -> float | None:
    bound = results.get("compute_bound", {})
    if str(batch) in bound:
        return bound[str(batch)]["rows_per_s"]
    # Between measured sizes: the nearest measured one below.
    sizes = sorted(int(k) for k in bound if int(k) <= batch)
    return bound[str(sizes[-1])]["rows_per_s"] if sizes else None


# -- targets -----------------------------------------------------------------------------------


def targets(results: dict) -> list[tuple[str, str, str]]:
    """(target, met / not met, the numbers) for each goal of issues 7 and 10."""
    out = []
    batching = results.get("batching")
    max_batch = results["batch"]["max_batch_size"]
    if batching:
        ray = batching[RAY]["batched"].get("32")
        mpx = batching[MPX]["batched"].get("32")
        if ray and mpx:
            speedup = _ratio(mpx["rps"], ray["rps"])
            p99_ok = mpx["p99_ms"] <= ray["p99_ms"]
            bound = _bound_rows(results, bound_batch("batched", 32, max_batch))
            share = _ratio(mpx["rps"], bound)
            met = speedup >= 5 and p99_ok
            out.append((
                "Batching, concurrency 32: throughput >= 5x Ray Serve's, p99 no worse",
                "met" if met else "not met",
                f"{mpx['rps']:,.0f} vs {ray['rps']:,.0f} req/s = {speedup:.1f}x (target 5x: "
                f"{'met' if speedup >= 5 else f'short by {5 - speedup:.1f}x'}); p99 {mpx['p99_ms']:.1f} vs "
                f"{ray['p99_ms']:.1f} ms ({'no worse' if p99_ok else 'worse'}); Modelplex reaches {share:.0%} of the "
                f"compute bound at batch {bound_batch('batched', 32, max_batch)} ({bound:,.0f} rows/s), Ray Serve "
                f"{_ratio(ray['rps'], bound):.0%}"))
    mux = results.get("multiplexing")
    if mux and all(s in mux["systems"] for s in SYSTEMS):
        ceiling = mux["offline"]["belady_global_8"]
        m, r = mux["systems"][MPX], mux["systems"][RAY]
        share = _ratio(m["hit_rate"], ceiling)
        out.append((
            "Multiplexing: hit rate >= 95% of Belady's for the trace",
            "met" if share >= 0.95 else "not met",
            f"Modelplex {m['hit_rate']:.3f} = {share:.0%} of Belady's {ceiling:.3f} (needs >= {0.95 * ceiling:.3f}); "
            f"Ray Serve {r['hit_rate']:.3f} = {_ratio(r['hit_rate'], ceiling):.0%}"))
        speedup = _ratio(m["rps"], r["rps"])
        out.append((
            "Multiplexing: throughput >= 3x Ray Serve's",
            "met" if speedup >= 3 else "not met",
            f"{m['rps']:.1f} vs {r['rps']:.1f} req/s = {speedup:.2f}x"))
    streaming = results.get("streaming")
    if streaming and all(s in streaming["systems"] for s in SYSTEMS):
        out += _ttfc_target("Streaming:", streaming["systems"][RAY].get("8"), streaming["systems"][MPX].get("8"))
        levels = sorted(int(c) for c in streaming["systems"][MPX])
        top = str(levels[-1])
        m_top = streaming["systems"][MPX][top]
        best = max(streaming["systems"][MPX][str(c)]["rps"] for c in levels)
        r_top = streaming["systems"][RAY].get(top, {})
        collapse = m_top["errors"] > 0 or m_top["rps"] < 0.9 * best
        out.append((
            f"Streaming: no collapse at {top} concurrent streams",
            "met" if not collapse else "not met",
            f"Modelplex {m_top['rps']:.0f} streams/s at {top} ({m_top['rps'] / best:.0%} of its best, {best:.0f}), "
            f"{m_top['errors']} errors, time to first chunk p99 {_f(m_top.get('ttfc_p99_ms'))} ms; Ray Serve "
            f"{_f(r_top.get('rps'), 0)} streams/s, {r_top.get('errors', '-')} errors, p99 {_f(r_top.get('ttfc_p99_ms'))} ms"))
    out += _busy_targets(results)
    if mux and mux["systems"].get(MPX, {}).get("overhead"):
        o = mux["systems"][MPX]["overhead"]
        out.append((
            "Router overhead: < 1 ms added p50 at concurrency 1",
            "met" if o["diff_p50"] < 1.0 else "not met",
            f"paired difference p50 {o['diff_p50']:.3f} ms (p99 {o['diff_p99']:.3f} ms); through the router "
            f"{o['router_p50']:.2f} ms vs straight to the replica {o['direct_p50']:.2f} ms"))
    return out


def _busy_targets(results: dict) -> list[tuple[str, str, str]]:
    busy = results.get("busy")
    if not busy or not all(s in busy["systems"] for s in SYSTEMS):
        return []
    out = []
    errors = {s: {mode: sum(p["errors"] for p in by_c.values()) for mode, by_c in busy["systems"][s].items()}
              for s in SYSTEMS}
    transitions = sum(h["not_ready_transitions"] for by_c in busy.get("modelplex_health", {}).values()
                      for h in by_c.values())
    total = sum(errors[MPX].values())
    out.append((
        "Busy replicas: Modelplex answers every CPU-bound request and stream (0 errors)",
        "met" if total == 0 else "not met",
        f"Modelplex {errors[MPX]['stream']} stream / {errors[MPX]['unary']} unary errors, router 'not ready' "
        f"lines {transitions}; Ray Serve {errors[RAY]['stream']} / {errors[RAY]['unary']}"))
    out += _ttfc_target("Busy replicas: CPU-bound stream,", busy["systems"][RAY]["stream"].get("8"),
                        busy["systems"][MPX]["stream"].get("8"))
    return out


def _ttfc_target(what: str, ray: dict | None, mpx: dict | None) -> list[tuple[str, str, str]]:
    """The streams' goal at concurrency 8: Modelplex's time to first chunk p99 at most half of
    Ray Serve's (nothing when either side has no such point)."""
    if not (ray and mpx and "ttfc_p99_ms" in ray and "ttfc_p99_ms" in mpx):
        return []
    ok = mpx["ttfc_p99_ms"] <= 0.5 * ray["ttfc_p99_ms"]
    return [(f"{what} time to first chunk p99 at concurrency 8 <= half of Ray Serve's", "met" if ok else "not met",
             f"{mpx['ttfc_p99_ms']:.1f} vs {ray['ttfc_p99_ms']:.1f} ms = "
             f"{_ratio(mpx['ttfc_p99_ms'], ray['ttfc_p99_ms']):.2f}x of Ray Serve's")]


# -- markdown ----------------------------------------------------------------------------------


def _groups_line(groups: dict | None) -> str:
    if not groups:
        return "- CPU: no cgroups (`--cpus 0`): each system got what the kernel gave its sessions"
    if "not_used" in groups:
        return f"- CPU: no cgroups ({groups['not_used']}): each system got what the kernel gave its sessions"
    if groups.get("shared"):
        return (f"- CPU: a {groups['cores_per_system']:g}-CPU machine on this one (`--shared-cpus`, "
                f"`bench/compare/cgroups.py`): the load generator and each system in its turn in one cgroup, "
                f"{'; '.join(groups['groups'])}")
    return (f"- CPU: each system in a cgroup of its own with the same quota, {groups['cores_per_system']:g} cores, "
            f"and weight (cpu.shares {groups['shares']}), the load generator in a third (`--cpus`, "
            f"`bench/compare/cgroups.py`): {'; '.join(groups['groups'])}")


def markdown(results: dict) -> str:
    env = results["environment"]
    s = results["settings"]
    lines = [f"# Modelplex vs Ray Serve{' (QUICK RUN: smoke numbers, not results)' if s['quick'] else ''}", ""]
    lines += ["Both systems ran on this machine in one run, one at a time, alternating, on the same handler "
              "code (`bench/compare/handlers.py`, built with `modelplex` and with `ray.serve`), driven by the same "
              "closed-loop aiohttp load generator in a separate process.", ""]
    lines += ["## Machine and versions", ""]
    wait = results.get("load_wait")
    phases = results["load"]
    others = [x["other_cores"] for x in phases if not math.isnan(x["other_cores"])]
    other_mean = sum(others) / len(others) if others else float("nan")
    lines += [
        f"- machine: {env['cores']} cores ({env['cpu']}), {env['memory_gb']} GB, {env['platform']}; "
        f"GPU: {env['gpu'] or 'none'}",
        f"- load average (1 min) at start: {wait['after_wait'][0]:.2f} (was {wait['before_wait'][0]:.2f}; "
        f"waited {wait['waited_s']:.0f} s for < 1.0)" if wait else "- load average: no wait for a quiet machine (quick run)",
        f"- other people's load during the run (CPU busy minus this run's own process tree, sampled each second; "
        f"table below): {other_mean:.2f} cores on average, at most {max(others, default=float('nan')):.2f} in a phase",
        f"- python {env['python']}, torch {env['torch']}, ray {env['ray']}, aiohttp {env['aiohttp']}, "
        f"modelplex {env['modelplex']} at commit `{env['commit']}` ({env['commit_subject']})"
        + (f"; {env['tree_dirty_outside_bench']} uncommitted path(s) outside bench/ in the working tree"
           if env["tree_dirty_outside_bench"] else ""),
        f"- command: `{results['command']}` ({results['started']}, {results['wall_s']:.0f} s wall)",
        f"- Ray: `ray.init(num_cpus=2, include_dashboard=False)`, Serve's HTTP proxy on 127.0.0.1, "
        f"defaults otherwise (start {', '.join(f'{x:.1f}' for x in results['ray_start_s']) or '-'} s); "
        "Modelplex: `modelplex local MANIFEST` (router + replica processes)",
        _groups_line(results.get("cpu_groups")),
        "",
    ]
    lines += ["Machine load by phase (cores of " + str(env["cores"]) + "; a 1-minute load average counts this run's "
              "own processes too, so the CPU split is the better measure of outside load):", ""]
    lines += [table(["phase", "seconds", "load avg at start", "CPU busy", "this run", "others"],
                    [[x["when"], f"{x['seconds']:.0f}", f"{x['load'][0]:.2f}", f"{x['busy_cores']:.2f}",
                      f"{x['our_cores']:.2f}", f"{x['other_cores']:.2f}"] for x in phases]), ""]
    for key, section in (("batching", _batching_md), ("multiplexing", _mux_md), ("streaming", _stream_md),
                         ("busy", _busy_md)):
        if results.get(key):  # a workload not run has no section
            lines += section(results)
    lines += _gpu_md(results)
    lines += ["## Targets (issues 7 and 10)", ""]
    goals = targets(results)
    lines += [table(["target", "result", "numbers"], [[t, f"**{r}**", n] for t, r, n in goals], "llr"), ""]
    lines += ["Where Modelplex falls short, what dominates and what would fix it, with the profiles and the "
              "experiments behind the numbers: [profiling.md](profiling.md).", ""]
    lines += ["## Method notes", ""]
    lines += [
        "- Same settings on both systems: the decorators' arguments (`@batch(max_batch_size=32, "
        "batch_wait_timeout_s=0.002)`, `@multiplexed(max_num_models_per_replica=4)`), the replica count and "
        "`max_ongoing_requests` per replica (Ray's default of 5 would cap every batch at 5). Ray replicas get "
        "`num_cpus: 1` each. One intra-op torch thread per replica on both.",
        "- Ray's adapter (`ray_app.py`) reads the starlette request's JSON and encodes answers with orjson, as "
        "Modelplex's replica does, so JSON encoding is not what differs. Ray Serve runs with its defaults "
        "otherwise (per-request access logging to files, user code in a separate thread).",
        "- Closed loop: each client sends its next request when its answer is in; every point has an "
        "unmeasured warm-up; throughput = answers in the window / window length (the last requests drain).",
        "- Workload 1 ran in alternating rounds (Ray, Modelplex, Modelplex, Ray, ...); the table pools them. "
        "The compute bound is the bare forward pass in the orchestrator's process, one thread, read at batch "
        "1 (unbatched) or min(concurrency, 32) (batched); it leaves out HTTP, JSON and tensor building.",
        "- Workload 2: one Zipf trace, sent in order by the clients from one shared cursor, so the servers see "
        "it in trace order up to the interleaving of concurrent requests. Loads are counted the same way on both "
        "systems, by the handler (a line per load in a file); Modelplex's `modelplex_model_loads_total` is read as "
        "a cross-check. Hit rate = 1 - loads / requests. The ceiling is Belady's offline optimum for one cache "
        "of the pool's total size (2 x 4 = 8) over the same trace: a partitioned 2 x 4 cache cannot beat it, "
        "except that Modelplex lets a replica run over capacity while all its models are busy.",
        "- Workload 3: each stream is 20 NDJSON records, 10 ms apart (first at once); time to first chunk is "
        "measured to the first line received.",
        "",
    ]
    return "\n".join(lines)


def _batching_md(results: dict) -> list[str]:
    batching = results["batching"]
    max_batch = results["batch"]["max_batch_size"]
    lines = ["## 1. Batching: 512-2048-2048-512 MLP, one replica, one intra-op thread", ""]
    bound = results["compute_bound"]
    lines += ["Compute bound, measured in-process (bare forward pass, one thread):", ""]
    lines += [table(["batch size", "ms per pass", "passes/s", "rows/s"],
                    [[k, f"{v['ms_per_pass']:.2f}", _f(v['passes_per_s'], 0), _f(v['rows_per_s'], 0)]
                     for k, v in bound.items()]), ""]
    rows = []
    for mode in ("unbatched", "batched"):
        for c in batching[RAY][mode]:
            r, m = batching[RAY][mode][c], batching[MPX][mode][c]
            b = bound_batch(mode, int(c), max_batch)
            ceiling = _bound_rows(results, b)
            rows.append([mode, c, _f(r["rps"], 0), _f(r["p50_ms"]), _f(r["p99_ms"]), str(r["errors"]),
                         _f(m["rps"], 0), _f(m["p50_ms"]), _f(m["p99_ms"]), str(m["errors"]),
                         f"{_ratio(m['rps'], r['rps']):.1f}x", f"{_f(ceiling, 0)} (b={b})",
                         f"{_ratio(r['rps'], ceiling):.0%}", f"{_ratio(m['rps'], ceiling):.0%}"])
    lines += [table(["mode", "conc.", "Ray req/s", "Ray p50 ms", "Ray p99 ms", "Ray err",
                     "Mpx req/s", "Mpx p50 ms", "Mpx p99 ms", "Mpx err", "Mpx / Ray",
                     "compute bound rows/s", "Ray share", "Mpx share"], rows, "lrrrrrrrrrrrrr"), ""]
    lines += ["![throughput](throughput_vs_concurrency.png)", ""]
    return lines


def _mux_md(results: dict) -> list[str]:
    mux = results["multiplexing"]
    lines = [f"## 2. Multiplexing: {mux['models']} models, Zipf({mux['zipf']}), {mux['replicas']} replicas x "
             f"{mux['slots']} slots, {mux['fetch_s'] * 1000:.0f} ms fetch + real construction", "",
             f"{mux['requests']} requests ({mux['distinct_in_trace']} distinct models) from {mux['concurrency']} "
             f"closed-loop clients; `max_ongoing_requests` {mux['max_ongoing']} per replica.", ""]
    ceiling = mux["offline"]["belady_global_8"]
    rows = []
    for system in SYSTEMS:
        e = mux["systems"].get(system)
        if not e:
            continue
        rows.append([system, f"{e['ok']}/{e['sent']}", str(e["loads"]), f"{e['hit_rate']:.3f}",
                     f"{_ratio(e['hit_rate'], ceiling):.0%}", _f(e["rps"]), _f(e["p50_ms"]), _f(e["p99_ms"]),
                     _f(e["load_p50_ms"]), " / ".join(map(str, e["per_replica_loads"])),
                     f"{e['loads_in_flight_mean']:.1f} / {e['loads_in_flight_max']}", str(e["top4_loads"]),
                     _f(e.get("c1_ms", {}).get("p50") or e.get("overhead", {}).get("router_p50"), 2)])
    lines += [table(["system", "ok/sent", "loads", "hit rate", "share of Belady", "req/s", "p50 ms", "p99 ms",
                     "load p50 ms", "loads per replica", "loads at once per replica (mean / max)",
                     "loads of the 4 hottest models", "c=1 p50 ms (warm)"], rows), ""]
    o = mux["offline"]
    lines += ["Offline hit rates of the same trace:", ""]
    lines += [table(["policy", "hit rate"], [
        ["Belady (optimal, offline), one cache of 8 = the ceiling", f"{o['belady_global_8']:.3f}"],
        ["LRU, one cache of 8", f"{o['lru_global_8']:.3f}"],
        ["the 8 most requested models pinned (needs the future's counts)", f"{o['static_top_8']:.3f}"],
        ["Belady, one replica's 4 slots", f"{o['belady_one_replica_4']:.3f}"],
    ]), ""]
    m = mux["systems"].get(MPX, {})
    if m.get("counters"):
        c = m["counters"]
        lines += [f"Modelplex's own counters: `modelplex_model_loads_total` {c['model_loads_total']:.0f} (handler "
                  f"count {m['loads']}), evictions {c['model_evictions_total']:.0f}, router cache hits "
                  f"{c['router_cache_hits_total']:.0f} / misses {c['router_cache_misses_total']:.0f}, hot spreads "
                  f"{c['router_fallbacks_total']:.0f}.", ""]
    if m.get("overhead"):
        ov = m["overhead"]
        lines += [f"Router overhead, concurrency 1, model loaded, {ov['pairs']} interleaved pairs:", ""]
        lines += [table(["path", "p50 ms", "p99 ms"], [
            ["straight to the replica (`/v1/invoke`)", f"{ov['direct_p50']:.3f}", f"{ov['direct_p99']:.3f}"],
            ["through the router (`/`)", f"{ov['router_p50']:.3f}", f"{ov['router_p99']:.3f}"],
            ["router overhead (paired difference)", f"{ov['diff_p50']:.3f}", f"{ov['diff_p99']:.3f}"],
            ["Ray Serve end to end (its proxy; for scale)", _f(mux['systems'].get(RAY, {}).get('c1_ms', {}).get('p50'), 3),
             _f(mux['systems'].get(RAY, {}).get('c1_ms', {}).get('p99'), 3)],
        ]), ""]
    lines += ["![hit rate](hit_rate.png)", ""]
    return lines


def _stream_md(results: dict) -> list[str]:
    st = results["streaming"]
    lines = [f"## 3. Streaming: {st['chunks']}-chunk responses, {st['interval_s'] * 1000:.0f} ms apart, "
             f"{st['replicas']} replicas", ""]
    rows = []
    for c in st["systems"].get(RAY, {}):
        r, m = st["systems"][RAY][c], st["systems"][MPX].get(c, {})
        rows.append([c, _f(r["rps"]), _f(r.get("chunks_per_s"), 0), _f(r.get("ttfc_p50_ms")), _f(r.get("ttfc_p99_ms")),
                     _f(r["p99_ms"]), str(r["errors"]),
                     _f(m.get("rps")), _f(m.get("chunks_per_s"), 0), _f(m.get("ttfc_p50_ms")), _f(m.get("ttfc_p99_ms")),
                     _f(m.get("p99_ms")), str(m.get("errors", "-"))])
    lines += [table(["conc.", "Ray streams/s", "Ray chunks/s", "Ray TTFC p50", "Ray TTFC p99", "Ray stream p99",
                     "Ray err", "Mpx streams/s", "Mpx chunks/s", "Mpx TTFC p50", "Mpx TTFC p99", "Mpx stream p99",
                     "Mpx err"], rows), "",
              "(TTFC: time to first chunk, ms; a stream's ideal length is "
              f"{(st['chunks'] - 1) * st['interval_s'] * 1000:.0f} ms.)", "",
              "![latency CDFs](latency_cdf.png)", ""]
    return lines


def _busy_md(results: dict) -> list[str]:
    busy = results["busy"]
    bound = busy["compute_bound"]
    health = busy.get("modelplex_health", {})
    lines = [f"## 4. Busy replicas: user code computing on its event loop, {busy['replicas']} replica", "",
             f"Handlers as users write them: synchronous torch inside `async def`, no thread. One forward pass "
             f"of the MLP on a {busy['rows']}-row batch takes {bound['ms_per_pass']:.1f} ms here (in-process, one "
             f"thread: {bound['passes_per_s']:.0f} passes/s). `max_ongoing_requests` {busy['max_ongoing']} on "
             f"both; {busy['seconds']:.0f} s per point, {busy['rounds']} alternating round(s), pooled. Modelplex "
             "only: the replica's `/readyz` polled every 100 ms by a separate client during each point, and the "
             "router's \"is not ready\" log lines counted.", ""]

    def health_cells(mode: str, c: str) -> list[str]:
        h = health.get(mode, {}).get(c)
        if not h:
            return ["-", "-"]
        failed = f" ({h['readyz_failed']} failed)" if h["readyz_failed"] else ""
        return [_f(h["readyz_p99_ms"]) + failed, str(h["not_ready_transitions"])]

    def cpu(p: dict) -> str:
        if not p or p.get("server_cores") is None:
            return "-"
        return f"{p['server_cores']:.2f} / {_f(p.get('server_cpu_ms_per_answer'), 0)}"

    def errs(p: dict) -> str:
        kinds = ", ".join(f"{k}: {v}" for k, v in p.get("error_kinds", {}).items())
        return f"{p['errors']}" + (f" ({kinds})" if kinds else "")

    ray, mpx = busy["systems"].get(RAY, {}), busy["systems"].get(MPX, {})
    rows = []
    for c, r in ray.get("stream", {}).items():
        m = mpx.get("stream", {}).get(c, {})
        rows.append([c, _f(r["rps"], 2), _f(r.get("ttfc_p50_ms")), _f(r.get("ttfc_p99_ms")), _f(r["p99_ms"]), errs(r),
                     cpu(r), _f(m.get("rps"), 2), _f(m.get("ttfc_p50_ms")), _f(m.get("ttfc_p99_ms")),
                     _f(m.get("p99_ms")), errs(m) if m else "-", cpu(m), *health_cells("stream", c)])
    lines += [f"Streams of {busy['chunks']} chunks, each chunk one forward pass (ideal: "
              f"{bound['passes_per_s'] / busy['chunks']:.1f} streams/s on one core):", ""]
    lines += [table(["conc.", "Ray streams/s", "Ray TTFC p50", "Ray TTFC p99", "Ray stream p99", "Ray err",
                     "Ray cores / CPU ms per stream", "Mpx streams/s", "Mpx TTFC p50", "Mpx TTFC p99",
                     "Mpx stream p99", "Mpx err", "Mpx cores / CPU ms per stream", "Mpx /readyz p99",
                     "router 'not ready'"], rows), ""]
    rows = []
    for c, r in ray.get("unary", {}).items():
        m = mpx.get("unary", {}).get(c, {})
        rows.append([c, _f(r["rps"]), _f(r["p50_ms"]), _f(r["p99_ms"]), errs(r), cpu(r), _f(m.get("rps")),
                     _f(m.get("p50_ms")), _f(m.get("p99_ms")), errs(m) if m else "-", cpu(m),
                     f"{_ratio(m.get('rps'), r['rps']):.1f}x", *health_cells("unary", c)])
    lines += [f"Unbatched, one {busy['rows']}-row forward pass per request (ideal: {bound['passes_per_s']:.0f} req/s):", ""]
    lines += [table(["conc.", "Ray req/s", "Ray p50 ms", "Ray p99 ms", "Ray err", "Ray cores / CPU ms per req",
                     "Mpx req/s", "Mpx p50 ms", "Mpx p99 ms", "Mpx err", "Mpx cores / CPU ms per req", "Mpx / Ray",
                     "Mpx /readyz p99", "router 'not ready'"], rows), ""]
    lines += ["(ms throughout; TTFC: time to first chunk; errors are non-200 answers, transport errors and "
              "streams cut short of their chunks. Cores / CPU ms: the CPU the system's own processes used during "
              "the point (Ray: the driver, GCS, raylet, proxy, controller, replica; Modelplex: supervisor, router, "
              "replica), as cores and per answer. On a machine that others load, throughput follows the share of "
              "the cores a system gets; the CPU per answer does not.)", ""]
    return lines


def _gpu_md(results: dict) -> list[str]:
    gpu = results.get("gpu")
    lines = ["## GPU variant of workload 1", ""]
    if not gpu:
        return lines + ["not run (not among `--workloads`)", ""]
    if "skipped" in gpu:
        return lines + [gpu["skipped"], ""]
    lines += [f"Device {gpu['device']}, MLP {'-'.join(map(str, gpu['sizes']))}, batches of up to 256.", ""]
    lines += [table(["batch size", "ms per pass", "rows/s"],
                    [[k, f"{v['ms_per_pass']:.3f}", _f(v['rows_per_s'], 0)] for k, v in gpu["compute_bound"].items()]), ""]
    rows = []
    for c in gpu["systems"].get(RAY, {}):
        r, m = gpu["systems"][RAY][c], gpu["systems"][MPX].get(c, {})
        rows.append([c, _f(r["rps"], 0), _f(r["p50_ms"]), _f(r["p99_ms"]), _f(m.get("rps"), 0), _f(m.get("p50_ms")),
                     _f(m.get("p99_ms")), f"{_ratio(m.get('rps'), r['rps']):.1f}x"])
    lines += [table(["conc.", "Ray req/s", "Ray p50", "Ray p99", "Mpx req/s", "Mpx p50", "Mpx p99", "Mpx / Ray"], rows), ""]
    return lines


# -- plots -------------------------------------------------------------------------------------


def plots(results: dict, latencies: dict, out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["matplotlib is not installed: no plots"]
    written: list[str] = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    max_batch = results["batch"]["max_batch_size"]

    batching, streaming = results.get("batching"), results.get("streaming")
    if batching or streaming:
        count = bool(batching) + bool(streaming)
        fig, axes = plt.subplots(1, count, figsize=(6 * count, 4.5))
        axes = list(axes) if count > 1 else [axes]
        if batching:
            ax = axes[0]
            for system in SYSTEMS:
                for mode, style in (("batched", "-o"), ("unbatched", "--s")):
                    data = batching[system][mode]
                    cs = [int(c) for c in data]
                    ax.plot(cs, [data[str(c)]["rps"] for c in cs], style, color=COLORS[system], label=f"{system}, {mode}")
            cs = [int(c) for c in batching[MPX]["batched"]]
            ax.plot(cs, [_bound_rows(results, bound_batch("batched", c, max_batch)) for c in cs], ":", color="gray",
                    label="compute bound, batched (in-process)")
            ax.axhline(_bound_rows(results, 1), linestyle="-.", color="lightgray", label="compute bound, batch 1")
            ax.set_xscale("log", base=2)
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.set_yscale("log")
            ax.set_xlabel("concurrency (closed-loop clients)")
            ax.set_ylabel("requests/s")
            ax.set_title("1. Batching: MLP throughput")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        if streaming:
            ax = axes[-1]
            for system in SYSTEMS:
                data = streaming["systems"].get(system, {})
                cs = [int(c) for c in data]
                ax.plot(cs, [data[str(c)]["rps"] for c in cs], "-o", color=COLORS[system], label=system)
            ideal = [c / ((streaming["chunks"] - 1) * streaming["interval_s"]) for c in cs]
            ax.plot(cs, ideal, ":", color="gray", label=f"ideal (a stream takes {(streaming['chunks'] - 1) * streaming['interval_s'] * 1000:.0f} ms)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel("streams/s (20 chunks each)")
            ax.set_title("3. Streaming throughput")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        save(fig, "throughput_vs_concurrency.png")

    panels = []
    if batching:
        panels.append(("1. Batched MLP, concurrency 32: latency", {s: latencies["batching"][s]["batched"].get("32", [])
                                                                  for s in SYSTEMS}))
    mux = results.get("multiplexing")
    if mux:
        panels.append(("2. Multiplexing trace: latency", {s: latencies["mux"].get(s, []) for s in SYSTEMS}))
    if streaming:
        for c in ("8", str(max(int(k) for k in streaming["systems"][MPX]))):
            panels.append((f"3. Streaming, concurrency {c}: time to first chunk",
                           {s: latencies["ttfc"].get(s, {}).get(c, []) for s in SYSTEMS}))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4))
        axes = axes if len(panels) > 1 else [axes]
        for ax, (title, data) in zip(axes, panels):
            for system, values in data.items():
                if not values:
                    continue
                v = sorted(x * 1000 for x in values)
                ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], color=COLORS[system], label=system)
            ax.set_xscale("log")
            ax.set_xlabel("ms")
            ax.set_ylabel("fraction of requests")
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, "latency_cdf.png")

    if mux and mux["systems"]:
        labels, values, colors = [], [], []
        for system in SYSTEMS:
            if system in mux["systems"]:
                labels.append(system)
                values.append(mux["systems"][system]["hit_rate"])
                colors.append(COLORS[system])
        for key, label in (("belady_global_8", "Belady, 8 (ceiling)"), ("static_top_8", "top-8 pinned"),
                           ("lru_global_8", "LRU, 8"), ("belady_one_replica_4", "Belady, 4")):
            labels.append(label)
            values.append(mux["offline"][key])
            colors.append("gray")
        fig, ax = plt.subplots(figsize=(7, 4))
        bars = ax.bar(labels, values, color=colors)
        for bar, value in zip(bars, values):
            ax.text(bar.get_x() + bar.get_width() / 2, value + 0.01, f"{value:.2f}", ha="center", fontsize=8)
        ax.axhline(0.95 * mux["offline"]["belady_global_8"], linestyle="--", color="black", linewidth=0.8,
                   label="target: 95% of Belady")
        ax.set_ylim(0, 1)
        ax.set_ylabel("hit rate (1 - loads / requests)")
        ax.set_title(f"2. Multiplexing hit rate, Zipf({mux['zipf']}), {mux['models']} models, 2 x 4 slots")
        ax.legend(fontsize=8)
        plt.setp(ax.get_xticklabels(), rotation=15, fontsize=8)
        save(fig, "hit_rate.png")
    return written


def write(results: dict, out: Path) -> None:
    latencies = {
        "batching": results.pop("batching_latencies", {}),
        "mux": {s: e.pop("trace_latencies", []) for s, e in results.get("multiplexing", {}).get("systems", {}).items()},
        "ttfc": results.get("streaming", {}).pop("ttfc", {}),
    }
    written = plots(results, latencies, out)
    text = markdown(results)
    (out / "README.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(text)
    print("plots: " + ", ".join(written))
