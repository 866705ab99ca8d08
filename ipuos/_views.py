"""What ``ps`` and ``status`` print: daemon replies turned into text and into ``--json``.

Kept apart from the click commands so the formats can be read (and tested) on their own.
A ``ps`` reply is compact (one letter per tile state, for 47,104 tiles); ``--json``
expands it into one object per tile, which is what scripts want.
"""

from __future__ import annotations

from ._plural import plural
from ._shown import shown
from ._tilespec import format_tiles, parse_tiles


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def human_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def simulated_time(seconds: float) -> str:
    """Simulated chip time, in the unit that reads best (exchange times are tiny)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


# -- ps ---------------------------------------------------------------------------------------


def tile_records(ps: dict, tiles: list[int] | None = None) -> list[dict]:
    """One dict per tile (all, or those in ``tiles``) from a compact ``ps`` reply."""
    codes = ps["state_codes"]
    total = ps["sram_per_tile"]
    waiting = ps["waiting"]
    per_chip = ps["tiles_per_chip"]
    chosen = range(ps["ntiles"]) if tiles is None else tiles
    return [
        {
            "tile": t,
            "ipu": t // per_chip,
            "state": codes.get(ps["states"][t], "unknown"),
            "job": ps["jobs_of_tiles"][t],
            "sram_used": ps["sram_used"][t],
            "sram_total": total,
            "waiting": waiting.get(str(t)),
        }
        for t in chosen
    ]


def ps_json(name: str, ps: dict, tiles: list[int] | None = None) -> dict:
    """``ps --json``: the vocabulary of every document (the machine is ``name``, counts
    are ``ntiles``/``njobs``, ``tiles`` and ``jobs`` lists; a job's program is ``program``)."""
    # (a job the daemon hosts may hold no tile in the snapshot: started or ended meanwhile)
    jobs = [{"job": job["job"], "program": job["name"],
             "tiles": parse_tiles(job["tiles"], ps["ntiles"]) if job["tiles"] else [],
             **{key: job[key] for key in ("ntiles", "elapsed_seconds", "client_pid")}} for job in ps["jobs"]]
    document = {"name": name, "ntiles": ps["ntiles"], "njobs": len(jobs),
                "tiles": tile_records(ps, tiles), "jobs": jobs}
    for key in ("stale_seconds", "stale_reason"):  # (scripts must know it is old news)
        if key in ps:
            document[key] = ps[key]
    return document


def state_counts(ps: dict) -> dict[str, int]:
    counts = {state: 0 for state in ps["state_codes"].values()}
    for code, state in ps["state_codes"].items():
        counts[state] = ps["states"].count(code)
    return counts


def format_ps(name: str, ps: dict, tiles: list[int] | None = None) -> str:
    """Tiles grouped by chip, state and job (or listed one by one when ``tiles`` is
    given), then jobs. A machine of several chips has an IPU column: a group never spans
    two chips (a job may, and its tiles on each show apart)."""
    total = human_bytes(ps["sram_per_tile"])
    ipus = ps["ntiles"] // ps["tiles_per_chip"]
    rows = [("IPU", "TILES", "STATE", "JOB", "SRAM USED", "WAITING FOR")]
    if tiles is None:
        groups: dict[tuple, list[int]] = {}
        for record in tile_records(ps):
            groups.setdefault((record["ipu"], record["state"], record["job"]), []).append(record["tile"])
        used = ps["sram_used"]
        for (ipu, state, job), members in sorted(groups.items(), key=lambda g: g[1][0]):
            low, high = min(used[t] for t in members), max(used[t] for t in members)
            span = human_bytes(low) if low == high else f"{human_bytes(low)}-{human_bytes(high)}"
            reasons = sorted({shown(ps["waiting"][str(t)]) for t in members if str(t) in ps["waiting"]})
            wait = ", ".join(reasons[:2]) + (f" (+{len(reasons) - 2} more)" if len(reasons) > 2 else "")
            rows.append((str(ipu), format_tiles(members), state, _job(job), f"{span} of {total}", wait))
    else:
        for record in tile_records(ps, tiles):
            rows.append((str(record["ipu"]), str(record["tile"]), record["state"], _job(record["job"]),
                         f"{human_bytes(record['sram_used'])} of {total}", shown(record["waiting"] or "")))
    if ipus == 1:  # (one chip: the column says nothing)
        rows = [row[1:] for row in rows]
    counts = ", ".join(f"{n} {state}" for state, n in state_counts(ps).items() if n)
    chips = f" on {ipus} IPUs" if ipus > 1 else ""
    lines = [f"machine {name!r}: {ps['ntiles']} tiles{chips} ({counts})", *_table(rows)]
    if ps.get("stale_reason"):
        lines.insert(0, f"note: {ps['stale_reason']}")
    if ps["jobs"]:
        jobs = [("JOB", "TILES", "NAME", "ELAPSED", "CLIENT PID")]
        for job in ps["jobs"]:
            elapsed = job["elapsed_seconds"]
            jobs.append((str(job["job"]), job["tiles"] or "-", shown(job["name"]) or "-",
                         human_duration(elapsed) if elapsed is not None else "-",
                         str(job["client_pid"]) if job["client_pid"] else "-"))
        lines += ["", *_table(jobs)]
    else:
        lines.append("no jobs running")
    return "\n".join(lines) + "\n"


def _job(job) -> str:
    return "-" if job is None else str(job)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


# -- status -----------------------------------------------------------------------------------


def format_status(status: dict) -> str:
    rows = [
        ("machine", f"{status['name']} (pid {status['pid']})"),
        ("preset", f"{status['preset']}: {plural(status['ipus'], 'IPU')} x "
                   f"{status['tiles_per_chip']} tiles = {status['ntiles']} tiles, "
                   f"{human_bytes(status['sram_per_tile'])} SRAM per tile"),
        ("uptime", f"{human_duration(status['uptime_seconds'])} (booted in {status['boot_seconds']:.3f} s)"),
        ("jobs", f"{status['njobs']} running"),
        ("supersteps", f"{status['supersteps']} ({status['supersteps_with_traffic']} with exchange traffic)"),
        ("exchanged", human_bytes(status["bytes_exchanged"])),
        ("exchange time", f"{simulated_time(status['simulated_exchange_seconds'])} SIMULATED "
                          "(modelled chip time, not host wall time)"),
        ("socket", status["socket"]),
        ("log", status["log"]),
        ("protocol", f"version {status['protocol']} (ipuos {status['ipuos']})"),
    ]
    width = max(len(key) for key, _ in rows)
    note = f"note: {status['stale_reason']}\n" if status.get("stale_reason") else ""
    return note + "".join(f"{key.ljust(width)}  {value}\n" for key, value in rows)
