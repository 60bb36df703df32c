"""Decisions made from records: winners, search strategies, coverage, validation, holdout,
refinement and probes."""
