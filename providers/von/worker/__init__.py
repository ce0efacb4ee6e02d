"""Von, worker side: runs in the worker process (torch lives here)."""
