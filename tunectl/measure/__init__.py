"""The measuring engine: runner, harness, samplers and timing methods, the drift guard, NVML, rounds."""
