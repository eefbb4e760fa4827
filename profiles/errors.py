"""Every named error, in one place. Each message is one sentence: what was wrong and what to do next.

The server turns any NsightfulError into an MCP error (or the CLI into one line on stderr) in one place;
the classes tell callers and tests what went wrong, by layer.
"""


class NsightfulError(Exception):
    """Base of every error the server turns into a clean MCP/CLI error."""


class InvalidRequest(NsightfulError):
    """A parameter is valid by type but not for this profile (device, window, name)."""


# --- loading a profile (profiles/) ----------------------------------------------------------------
class ProfileNotFound(NsightfulError):
    pass


class NotAProfile(NsightfulError):
    """The file exists but is not a usable Nsight Systems export."""


class ConversionNeeded(NsightfulError):
    """A .nsys-rep/.qdrep that cannot be converted here."""


class ConversionFailed(NsightfulError):
    pass


class ProfileChanged(NsightfulError):
    """The export's file changed while it was being read: the model would mix two contents."""


class CacheUnwritable(NsightfulError):
    """The cache folder cannot be written (open_profile then builds in a temporary folder)."""


class LoadCancelled(NsightfulError):
    pass


class MemorySettingInvalid(NsightfulError):
    """NSIGHTFUL_BUILD_MEMORY_MB or NSIGHTFUL_MODEL_MEMORY_MB is not a whole number of MB."""


class BuildOutOfMemory(NsightfulError):
    """The build needed more memory than its limit, or more disk than the cache folder has for spilling."""


class ModelOutOfMemory(NsightfulError):
    """A tool call on an open model needed more memory than the model's limit, and could not spill."""


# --- the book and the questions (resources/) ------------------------------------------------------
class BookError(NsightfulError):
    """A packaged book or question file is malformed."""


class UnknownEntry(NsightfulError):
    pass


class UnknownPhase(NsightfulError):
    pass


# --- tools/ ---------------------------------------------------------------------------------------
class QueryRefused(InvalidRequest):
    """query_sql was given something other than one read-only SELECT."""


# --- serving (server/) ----------------------------------------------------------------------------
class OutsideRoots(InvalidRequest):
    """A path outside the folders given with --root."""


class UnknownProfile(InvalidRequest):
    """No profile is loaded with that id in this session."""


class BudgetSettingInvalid(NsightfulError):
    """NSIGHTFUL_MAX_RESULT_CHARS / --max-result-chars is not a usable value."""


class ResultTooLarge(InvalidRequest):
    """A result does not fit the character budget even cut to one row."""


class InsecureBind(NsightfulError):
    """HTTP on a non-loopback address without a bearer token."""


class ClientGone(NsightfulError):
    """The HTTP client left before the answer was ready (said to nobody; it ends the call)."""


# --- jobs: every rank of a run (profiles/job*, server/jobs) ---------------------------------------
class DaskUnavailable(NsightfulError):
    """A scheduler was asked for but Dask is not installed, or it cannot be reached."""


class NoJobFiles(InvalidRequest):
    """load_job was given paths, a folder or a glob that name no profile."""


class RanksInvalid(InvalidRequest):
    """Two files claim one rank, or ranks are missing between the lowest and the highest."""


class UnknownJob(InvalidRequest):
    """No job is loaded with that id in this session."""
