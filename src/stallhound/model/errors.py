"""Every named error, in one place. Each message is one sentence: what was wrong and what to do next.

The server turns any StallhoundError into an MCP error (or the CLI into one line on stderr) in one place;
the classes tell callers and tests what went wrong, by layer. `echo` is how a message repeats what it was given,
and `said` how any message leaves us: both keep an answer to one short line whatever the input.
"""

import re

MAX_ECHO_CHARS = 200  # of an input repeated in an error: enough to recognise a path or a value, never a pasted file
# Of a whole error: the longest worded ones list what is valid (the book's ids, about 900 characters).
MAX_SAID_CHARS = 2000
ELLIPSIS = "\u2026"
LONG_RUN = re.compile(rf"\S{{{MAX_ECHO_CHARS + 1},}}")  # an unbroken run longer than an echo: a pasted input
ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")  # a native address (a DuckDB INTERNAL error's backtrace)


def _one_line(text: str) -> str:
    """Control characters (a newline in a path, a NUL, raw bytes) as escapes, so the text stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cut(text: str, limit: int) -> str:
    """At most `limit` characters, cut in the middle so that a path keeps its file name."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return f"{text[:head]}{ELLIPSIS}{text[len(text) - (limit - 1 - head):]}"


def echo(value: object) -> str:
    """`value` as an error repeats it: one line, at most MAX_ECHO_CHARS."""
    return _cut(_one_line(str(value)), MAX_ECHO_CHARS)


def said(message: str) -> str:
    """A message as it leaves the server or the CLI: one line, no native addresses, each unbroken run (a path, a
    number, pasted bytes) at most MAX_ECHO_CHARS, the whole at most MAX_SAID_CHARS."""
    text = ADDRESS.sub("0x\u2026", _one_line(message.strip()))
    text = LONG_RUN.sub(lambda m: _cut(m.group(0), MAX_ECHO_CHARS), text)
    return _cut(text, MAX_SAID_CHARS)


class StallhoundError(Exception):
    """Base of every error the server turns into a clean MCP/CLI error."""


class InvalidRequest(StallhoundError):
    """A parameter is valid by type but not for this profile (device, window, name)."""


# --- loading a profile (formats/) -----------------------------------------------------------------
class ProfileNotFound(StallhoundError):
    pass


class NotAProfile(StallhoundError):
    """The file exists but no registered format reads it."""


class ConversionNeeded(StallhoundError):
    """A .nsys-rep/.qdrep that cannot be converted here."""


class ConversionFailed(StallhoundError):
    pass


class ProfileChanged(StallhoundError):
    """The export's file changed while it was being read: the model would mix two contents."""


class CacheUnwritable(StallhoundError):
    """The cache folder cannot be written (open_profile then builds in a temporary folder)."""


class LoadCancelled(StallhoundError):
    pass


class MemorySettingInvalid(StallhoundError):
    """STALLHOUND_BUILD_MEMORY_MB or STALLHOUND_MODEL_MEMORY_MB is not a whole number of MB."""


class BuildOutOfMemory(StallhoundError):
    """The build needed more memory than its limit, or more disk than the cache folder has for spilling."""


class ModelOutOfMemory(StallhoundError):
    """A tool call on an open model needed more memory than the model's limit, and could not spill."""


# --- the book and the questions (book/) -----------------------------------------------------------
class BookError(StallhoundError):
    """A packaged book or question file is malformed."""


class UnknownEntry(StallhoundError):
    pass


class UnknownPhase(StallhoundError):
    pass


# --- tools/ ---------------------------------------------------------------------------------------
class QueryRefused(InvalidRequest):
    """query_sql was given something other than one read-only SELECT."""


# --- serving (server/) ----------------------------------------------------------------------------
class OutsideRoots(InvalidRequest):
    """A path outside the folders given with --root."""


class UnknownProfile(InvalidRequest):
    """No profile is loaded with that id in this session."""


class NoLoadUnderWay(InvalidRequest):
    """cancel_load named files no load is building now."""


class BudgetSettingInvalid(StallhoundError):
    """STALLHOUND_MAX_RESULT_CHARS / --max-result-chars is not a usable value."""


class ResultTooLarge(InvalidRequest):
    """A result does not fit the character budget even cut to one row."""


class InsecureBind(StallhoundError):
    """HTTP on a non-loopback address without a bearer token."""


class WeakToken(StallhoundError):
    """A bearer token too short, too repetitive or with whitespace to guard the server."""


class ClientGone(StallhoundError):
    """The HTTP client left before the answer was ready (said to nobody; it ends the call)."""


# --- jobs: every rank of a run (jobs/) ------------------------------------------------------------
class DaskUnavailable(StallhoundError):
    """A scheduler was asked for but Dask is not installed, or it cannot be reached."""


class NoJobFiles(InvalidRequest):
    """load_job was given paths, a folder or a glob that name no profile."""


class RanksInvalid(InvalidRequest):
    """Two files claim one rank, or ranks are missing between the lowest and the highest."""


class UnknownJob(InvalidRequest):
    """No job is loaded with that id in this session."""


# --- the command line (cli/) ----------------------------------------------------------------------
class BadOption(StallhoundError):
    """A command-line argument the command cannot use: out of range, not a folder, or two that conflict."""


class BadParam(BadOption):
    """A -p KEY=VALUE the tool's Params refuse: not KEY=VALUE, a key it has not, or a value of the wrong type."""


class UnknownTool(BadOption):
    """`stallhound tool NAME` names no tool."""


class ReportUnwritable(StallhoundError):
    """The HTML file given with -o cannot be written."""
