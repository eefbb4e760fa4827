"""What the trace shows besides the idle attribution that the idle findings (idle_causes) depend on."""
from __future__ import annotations

from dataclasses import dataclass, field

from stallhound.analysis.idle_bubbles import HostSeen
from stallhound.analysis.one_shot import Fragment, OneShot
from stallhound.analysis.python_work import PythonWhere
from stallhound.analysis.step_repeats import SameSteps
from stallhound.analysis.trace_quality import LostKernels, SampledCalls


@dataclass(frozen=True)
class Seen:
    """What the trace shows besides the idle attribution that the idle findings depend on."""
    loader: tuple[str, ...] = ()  # what shows the program's data loader (input_pipeline.evidence; empty: none)
    lost: LostKernels | None = None  # the window's launches whose kernel records were lost (trace_quality)
    sampled: SampledCalls | None = None  # the window's calls recorded after calls the trace left out (trace_quality)
    launches: dict[int, tuple[int, int]] = field(default_factory=dict)  # per device (launch calls' ns, their
    # kernels' ns) over the window (launch_pace); a device absent: its launches were not traced
    same_steps: dict[int, SameSteps] = field(default_factory=dict)  # per device whose steps in the window all run
    # one kernel sequence (step_repeats); computed only where tiny kernels' launch gaps could fire a finding
    host: dict[tuple[int, bool], HostSeen] = field(default_factory=dict)  # per (device, edges in): the launching
    # process's activity in the unexplained idle (idle_bubbles.host_seen)
    unsampled: str | None = None  # no CPU samples (CPU work seen by the scheduler only): the capture that records them
    one_shot: dict[int, OneShot | Fragment] = field(default_factory=dict)  # per device where the program
    # repeats nothing, or every device of a capture that began mid-run
    python: dict[int, PythonWhere] = field(default_factory=dict)  # per device (python_work.where)
