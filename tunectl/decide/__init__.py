"""Decisions made from records: winners, search strategies, coverage, validation, holdout and refinement."""
