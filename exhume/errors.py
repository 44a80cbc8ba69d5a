"""User-facing errors.

Every mistake a user can make (a wrong path, a corrupt file, mismatched shapes, NaN weights, an
unknown method name) is raised as an :class:`ExhumeError` whose message names the thing and what
was expected. The CLI prints the message and exits with status 2 instead of a traceback.
"""


class ExhumeError(Exception):
    """An error caused by the user's input; its message is meant to be read by that user."""


class DataError(ExhumeError):
    """A data file or dataset specification is missing, corrupt or of the wrong shape."""


class VictimError(ExhumeError):
    """A victim folder or model is missing, corrupt or inconsistent."""


class ConfigError(ExhumeError):
    """An unknown name or an invalid keyword argument."""


class DivergenceError(ExhumeError):
    """A numerical failure: a loss or gradient became NaN/inf (lower a learning rate, raise a damping).

    Distinct from :class:`ConfigError` (a bad setting): a hyperparameter search counts a diverged
    run as a very bad outcome, while a bad setting stops the search.
    """
