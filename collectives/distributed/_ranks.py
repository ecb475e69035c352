"""What every rank reports, shared through JAX's coordination service.

After its target, each rank stores one small JSON record (exit code, summary,
error) in the coordination service's key-value store, which lives on rank 0
and needs no collective: a rank whose collective failed can still report.
Every rank then reads every record, so every rank knows whether the job as a
whole passed, and rank 0 prints one table. A rank that never reports within
the bound is named as missing.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from collectives import _compat

_KEY = "collectives/{what}/{rank}"


@dataclasses.dataclass(frozen=True)
class RankResult:
    """How one rank's target ended.

    Attributes:
      rank: the process index.
      code: its exit code (0: passed); ``None`` if it never reported.
      summary: its one-line result, e.g. ``"105 agree, 0 disagree"``.
      error: the exception it raised, if any.
      seconds: how long its target ran.
      host: the host it ran on.
    """

    rank: int
    code: int | None
    summary: str = ""
    error: str = ""
    seconds: float = 0.0
    host: str = ""

    @property
    def status(self) -> str:
        if self.code is None:
            return "missing"
        return "ok" if self.code == 0 else "failed"


def publish(what: str, rank: int, payload: Any) -> None:
    """Store ``payload`` (JSON-serialisable) as rank ``rank``'s ``what``."""
    _compat.key_value_set(_KEY.format(what=what, rank=rank), json.dumps(payload))


def collect(what: str, num_processes: int, timeout: float) -> list[Any]:
    """Every rank's ``what``, waiting up to ``timeout`` seconds in all; ``None``
    for a rank that did not publish it in time."""
    deadline = time.monotonic() + timeout
    out: list[Any] = []
    for rank in range(num_processes):
        left = max(0.001, deadline - time.monotonic())
        try:
            raw = _compat.key_value_get(_KEY.format(what=what, rank=rank), left)
        except Exception:  # JAX's runtime error type differs across versions
            out.append(None)
            continue
        out.append(json.loads(raw))
    return out


def share_result(mine: RankResult, num_processes: int, timeout: float
                 ) -> list[RankResult]:
    """Publish this rank's result and read everyone's."""
    publish("result", mine.rank, dataclasses.asdict(mine))
    records = collect("result", num_processes, timeout)
    return [RankResult(**record) if record else RankResult(rank=rank, code=None)
            for rank, record in enumerate(records)]


def table(results: list[RankResult], timeout: float) -> str:
    """The combined table rank 0 prints, and one closing line."""
    lines = [f"{'rank':<5} {'host':<16} {'status':<8} {'exit':>4} {'seconds':>8}  "
             "summary"]
    for r in results:
        code = "-" if r.code is None else str(r.code)
        summary = r.summary if r.code in (0, None) else (r.error or r.summary)
        if r.code is None:
            summary = f"no result within {timeout:g} s (died, hung or never started)"
        lines.append(f"{r.rank:<5} {r.host[:16]:<16} {r.status:<8} {code:>4} "
                     f"{r.seconds:>8.1f}  {summary.splitlines()[0] if summary else ''}")
    bad = [r.rank for r in results if r.status != "ok"]
    if bad:
        lines.append(f"FAILED: rank(s) {bad} of {len(results)} did not pass; every "
                     "rank exits non-zero.")
    else:
        lines.append(f"ok: all {len(results)} ranks passed")
    return "\n".join(lines)
