"""The data model: specs, plans, keys, buckets, records and the rules values must follow.

Standard library only; nothing here knows a kernel, a store or a scheduler.
"""
