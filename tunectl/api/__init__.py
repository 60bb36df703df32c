"""tunectl as a library: the front door the command line uses, one call per use case.

Calls take a ``Spec`` (``load_spec``), a ``Bundle`` (``read_bundle``) and small frozen options
objects; they return typed results and raise typed errors that carry their facts as fields
(``tunectl.api.errors``: a ``SpecError`` names the file and the field, an ``OptionError`` the option,
a ``NoResultsError`` the results and the run asked for). Ray, torch and pyarrow are imported only by
the calls that need them::

    from tunectl import api

    spec = api.load_spec("configs/quickstart.toml")
    print(api.plan(spec).count.num_items)  # counted, nothing measured
    done = api.submit(spec, "tunectl-results", api.SubmitOptions(cluster=api.Cluster(num_cpus=2)))
    best = api.winners("tunectl-results", api.Selection(run_ids=[done.run_id]))
    api.export_bundle("tunectl-results", "quickstart", "1", "bundles")
"""

from __future__ import annotations

from tunectl.api._running import cancel_on_sigterm
from tunectl.api.bundles import (
    Exported,
    diff_bundles,
    export_bundle,
    export_flex_options,
    export_lightllm,
    list_bundles,
    pack,
    promote,
    read_bundle,
    verify_bundle,
)
from tunectl.api.checks import (
    HoldoutRun,
    ProbeRun,
    ValidationFailed,
    ValidationRun,
    check_holdout,
    holdout,
    probe,
    validate,
)
from tunectl.api.confirming import (
    Confirmed,
    ConfirmOptions,
    confirm_candidates,
    plan_confirm,
    save_confirmed,
    shape_grid,
)
from tunectl.api.options import (
    Choices,
    Cluster,
    CompileOptions,
    ExportOptions,
    HoldoutOptions,
    ProbeOptions,
    Scope,
    SubmitOptions,
    ValidateOptions,
)
from tunectl.api.results import (
    Checkup,
    Selection,
    Winners,
    doctor,
    import_flex_log,
    records,
    report,
    run_quality,
    winners,
    worker_times,
)
from tunectl.api.runs import (
    RunLog,
    cancel,
    cancel_job,
    check_size,
    follow_job,
    job_logs,
    list_runs,
    plan,
    resume,
    run_log,
    submit,
    submit_job,
)
from tunectl.api.workers import workers_down, workers_list, workers_up
from tunectl.core.plan import CONFIRM_ABOVE_ITEMS
from tunectl.core.spec import CELL_SPAN, DEFAULT_MARGIN, Spec, load_spec
from tunectl.decide.candidates import DEFAULT_CANDIDATES
from tunectl.decide.probes import DEFAULT_PER_CELL, DEFAULT_SHORTLIST
from tunectl.decide.stacked import DEFAULT_LAYERS, DEFAULT_ROUNDS
from tunectl.runtime import Bundle
from tunectl.store.runs import DEFAULT_RESULTS

__all__ = [
    "CELL_SPAN",
    "CONFIRM_ABOVE_ITEMS",
    "DEFAULT_CANDIDATES",
    "DEFAULT_LAYERS",
    "DEFAULT_MARGIN",
    "DEFAULT_PER_CELL",
    "DEFAULT_RESULTS",
    "DEFAULT_ROUNDS",
    "DEFAULT_SHORTLIST",
    "Bundle",
    "Checkup",
    "Choices",
    "Cluster",
    "CompileOptions",
    "ConfirmOptions",
    "Confirmed",
    "ExportOptions",
    "Exported",
    "HoldoutOptions",
    "HoldoutRun",
    "ProbeOptions",
    "ProbeRun",
    "RunLog",
    "Scope",
    "Selection",
    "Spec",
    "SubmitOptions",
    "ValidateOptions",
    "ValidationFailed",
    "ValidationRun",
    "Winners",
    "cancel",
    "cancel_job",
    "cancel_on_sigterm",
    "check_holdout",
    "check_size",
    "confirm_candidates",
    "diff_bundles",
    "doctor",
    "export_bundle",
    "export_flex_options",
    "export_lightllm",
    "follow_job",
    "holdout",
    "import_flex_log",
    "job_logs",
    "list_bundles",
    "list_runs",
    "load_spec",
    "pack",
    "plan",
    "plan_confirm",
    "probe",
    "promote",
    "read_bundle",
    "records",
    "report",
    "resume",
    "run_log",
    "run_quality",
    "save_confirmed",
    "shape_grid",
    "submit",
    "submit_job",
    "validate",
    "verify_bundle",
    "winners",
    "worker_times",
    "workers_down",
    "workers_list",
    "workers_up",
]
