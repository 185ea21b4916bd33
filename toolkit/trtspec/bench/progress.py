"""Progress a person can read while a benchmark runs: one bar per route
(pairs sent so far against the most the route can take, cells decided, ETA)
on stderr, drawn with tqdm only when stderr is a terminal; with stderr
redirected (a log file, CI) nothing is drawn and the per-route progress lines
are all there is."""

from __future__ import annotations

import sys
from typing import Any, TextIO


class RouteBars:
    """Bars for one run; ``route()`` opens the next route's bar and closes
    the previous one."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty())
        self._bar: Any = None
        self._cells = 0

    @classmethod
    def off(cls) -> RouteBars:
        """Bars that never draw (library callers that did not ask for any)."""
        bars = cls()
        bars.enabled = False
        return bars

    def route(self, name: str, total_pairs: int, cells: int) -> None:
        self.close()
        self._cells = cells
        if not self.enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(
            total=total_pairs,
            desc=f"route={name}",
            unit="pair",
            file=self.stream,
            leave=True,
            dynamic_ncols=True,
        )
        self._bar.set_postfix_str(f"decided 0/{cells}")

    def update(self, pairs: int, decided: int) -> None:
        """``pairs`` new pairs sent (every arm of the batch answered);
        ``decided`` cells settled so far in this route."""
        if self._bar is None:
            return
        self._bar.set_postfix_str(f"decided {decided}/{self._cells}", refresh=False)
        self._bar.update(pairs)

    def finish_early(self) -> None:
        """Every cell decided before the cap: the bar ends where it is."""
        if self._bar is not None:
            self._bar.total = self._bar.n
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
