"""The sweep's table and the cases that are neither ok nor a clear error."""

from __future__ import annotations

from .harness import OUTCOMES, _exception_line


def first_lines(r: dict, n: int = 4) -> list[str]:
    lines = []
    for c in r["commands"]:
        if c["rc"] == 0 and not c["timed_out"] and r["outcome"] != "silent":
            continue
        err = [ln for ln in c["stderr"].splitlines() if ln.strip() and "%|" not in ln]
        outl = [ln for ln in c["stdout"].splitlines() if ln.strip()]
        head = [f"$ {' '.join(c['argv'][:2])} ... -> rc {c['rc']}{' (timeout)' if c['timed_out'] else ''}"]
        if "Traceback (most recent call last)" in c["stderr"]:
            head.append("  " + _exception_line(c["stderr"]))
        head += ["  " + ln[:200] for ln in (err[: n - 2] if err else outl[: n - 2])]
        lines += head
    return lines[: n + 4]


def report(results: list[dict], sweeps: list[str], wall: float, commit: str) -> int:
    print(f"\nbench_hostile on {commit}, {len(results)} cases in {wall:.0f} s\n")
    w = max(len(o) for o in OUTCOMES)
    print(f"{'sweep':8s} " + " ".join(f"{o:>{w}s}" for o in OUTCOMES) + f" {'total':>7s}")
    tot = {o: 0 for o in OUTCOMES}
    for s in sweeps:
        rs = [r for r in results if r["sweep"] == s]
        if not rs:
            continue
        cnt = {o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES}
        for o in OUTCOMES:
            tot[o] += cnt[o]
        print(f"{s:8s} " + " ".join(f"{cnt[o]:>{w}d}" for o in OUTCOMES) + f" {len(rs):>7d}")
    print(f"{'total':8s} " + " ".join(f"{tot[o]:>{w}d}" for o in OUTCOMES) + f" {len(results):>7d}")
    bad = [r for r in results if r["outcome"] not in ("ok", "clear error")]
    refused = [r for r in results if "valid input refused" in r["flags"]]
    if bad:
        print(f"\n{len(bad)} cases neither ok nor a clear error:")
        for r in bad:
            print(f"\n[{r['outcome']}] {r['sweep']}/{r['name']}: {r['desc'][:150]}")
            print(f"  why: {r['why'][:400]}")
            for ln in first_lines(r):
                print("  " + ln)
    if refused:
        print(f"\n{len(refused)} valid inputs refused:")
        for r in refused:
            print(f"  {r['sweep']}/{r['name']}: {r['desc'][:100]}: {r['why'][:200]}")
    status = 0 if tot["silent"] == tot["traceback"] == tot["hang"] == 0 and not refused else 1
    print(
        f"\nTOTAL {len(results)} cases: "
        + ", ".join(f"{tot[o]} {o}" for o in OUTCOMES)
        + f"; {len(refused)} valid inputs refused -> exit {status}"
    )
    return status
