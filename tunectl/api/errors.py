"""The errors the front door raises, for callers that catch them. Each error a caller may act on
carries its facts as fields (``tunectl.core.errors.Fielded``): ``str(error)`` words them, and
``problem()`` is that wording without the advice, for a caller that words its own."""

from __future__ import annotations

from tunectl.api.checks import ValidationFailed
from tunectl.core.errors import (
    BundleError,
    BundleExistsError,
    Fielded,
    NoResultsError,
    OptionError,
    ResultsError,
    SpecError,
    TunectlError,
    UserError,
)
from tunectl.formats.export import DamagedResultsError
from tunectl.orchestrator.control import IncompleteRun, OrchestrationError, RunStopped
from tunectl.runtime.format import (
    BundleCorruptError,
    BundleEnvironmentError,
    BundleNotFoundError,
    BundleReadError,
    BundleSchemaError,
)
from tunectl.store.results import BadPart
from tunectl.store.stores import StoreWriteError

__all__ = [
    "BadPart",
    "BundleCorruptError",
    "BundleEnvironmentError",
    "BundleError",
    "BundleExistsError",
    "BundleNotFoundError",
    "BundleReadError",
    "BundleSchemaError",
    "DamagedResultsError",
    "Fielded",
    "IncompleteRun",
    "NoResultsError",
    "OptionError",
    "OrchestrationError",
    "ResultsError",
    "RunStopped",
    "SpecError",
    "StoreWriteError",
    "TunectlError",
    "UserError",
    "ValidationFailed",
]
