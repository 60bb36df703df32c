"""Typed errors. Each says what went wrong and, where it can, what to do next.

The CLI turns ``UserError`` into one line on stderr and exit code 2; any other ``TunectlError``
into one line and exit code 1. Standard library only.
"""

from __future__ import annotations


class TunectlError(Exception):
    """Base of every error tunectl raises on purpose."""


class UserError(TunectlError):
    """Bad input from the user: a spec, an argument, a path."""


class SpecError(UserError):
    """A tuning spec that does not validate. Names the file and the field."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path, self.field, self.reason = path, field, message
        super().__init__(f"{path}: {field}: {message}")


class OptionError(UserError):
    """An option given to a library call that it does not take: names the option (``option``, as
    the call's keyword), the value and what it takes (``reason``: "must be ...")."""

    def __init__(self, option: str, value: object, reason: str) -> None:
        self.option, self.value, self.reason = option, value, reason
        super().__init__(f"{option}: {reason}")


class ResultsError(TunectlError):
    """The results dataset cannot be read or written as asked."""


class BundleError(TunectlError):
    """A bundle cannot be built, published or loaded."""


class BundleExistsError(BundleError, UserError):
    """Publishing a name/version that already exists (versions are immutable)."""
