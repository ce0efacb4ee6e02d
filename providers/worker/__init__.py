"""The worker process local providers share: scheduler, pass planner, precision, int8, readout."""
