"""The evidence the answers read: the tools' results for one profile on triage's window, each computed once
(through run_once, so what triage already ran comes from the per-model cache), and the figures no detector
computes (tools/answers/figures.py)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import duckdb

from stallhound.analysis import attribution
from stallhound.analysis.common import Output, R, Scope, as_result, run_once
from stallhound.model.errors import InvalidRequest
from stallhound.tools import iterations, profile_summary
from stallhound.tools.answers import figures as answer_figures
from stallhound.tools.triage import MAX_FINDINGS, RankedFinding
from stallhound.tools.triage import Result as TriageResult


class Evidence:
    """The tools' results for one profile, on triage's window, each computed once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, profile: str):
        self.con, self.profile = con, profile
        self._results: dict[tuple[str, tuple[tuple[str, Any], ...]], Output | None] = {}

    @cached_property
    def _triage(self) -> TriageResult | None:
        return self.tool("triage", TriageResult, window_scoped=False, limit=MAX_FINDINGS)

    @property
    def triage(self) -> TriageResult:
        """Triage's result, for the answerers: they run only when the profile is analysable."""
        assert self._triage is not None
        return self._triage

    @property
    def window(self) -> Scope:
        """Triage's window, for the answerers: they run only when the profile is analysable."""
        assert self.triage.window is not None
        return self.triage.window

    def tool(self, name: str, kind: type[R], window_scoped: bool = True, **params: Any) -> R | None:
        """The tool's result, its own Result `kind` (None when it cannot run here), on triage's window unless told
        otherwise."""
        from stallhound.tools import skills
        if window_scoped and self._triage is not None and self._triage.window is not None:
            w = self._triage.window
            params = {"start_ns": w.start_ns, "end_ns": w.end_ns, **params}
        key = (name, tuple(sorted(params.items())))
        if key not in self._results:
            module = skills()[name]
            try:
                self._results[key] = run_once(self.con, module, module.Params(profile=self.profile, **params))
            except InvalidRequest:
                self._results[key] = None
        found = self._results[key]
        return None if found is None else as_result(found, kind)

    @property
    def analysable(self) -> bool:
        """Whether triage found a window to analyse (an export with no timed event has none)."""
        return self._triage is not None and self._triage.window is not None

    @property
    def idle(self) -> attribution.Attribution:
        """Triage's idle attribution of its window (computed once per model and window)."""
        return attribution.attribute(self.con, self.window)

    def tiny_kernels(self) -> answer_figures.TinyKernels:
        return answer_figures.tiny_kernels(self.con, self.window)

    def device_syncs(self) -> answer_figures.DeviceSyncs:
        return answer_figures.device_syncs(self.con, self.window)

    @property
    def summary(self) -> profile_summary.Result:
        found = self.tool("profile_summary", profile_summary.Result, window_scoped=False)
        assert found is not None, "profile_summary reads the whole profile, with no window or device to refuse"
        return found

    def steps_in_window(self) -> int:
        """Iterations inside triage's window, from the capture's iterations: a steady-state window leaves out the
        first iteration when it is the warmup (iterations.steady_window), any other window holds them all."""
        it = self.tool("iterations", iterations.Result, window_scoped=False)
        if not it or not it.iteration_count:
            return 0
        steady = self.window.window_basis == "steady_state"
        return it.iteration_count - (1 if steady and iterations.first_is_warmup(it) else 0)

    def finding(self, *causes: str) -> list[RankedFinding]:
        return [f for f in (self._triage.findings if self._triage else []) if f.root_cause in causes]
