"""Named errors. Each message is one sentence: what was wrong and what to do next."""


class NsightfulError(Exception):
    """Base of every error the server turns into a clean MCP/CLI error."""


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


class InvalidRequest(NsightfulError):
    """A parameter is valid by type but not for this profile (device, window, name)."""
