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


class LoadCancelled(NsightfulError):
    pass


class InvalidRequest(NsightfulError):
    """A parameter is valid by type but not for this profile (device, window, name)."""
