"""Kernels to tune: the TuningTask protocol, the measurement harness, one module per kernel family."""
