"""The worker process local providers share: its host, the pass planner, numerics, answers."""
