"""Ray: start or join a cluster, place one worker per GPU, dispatch work, survive faults, resume."""
