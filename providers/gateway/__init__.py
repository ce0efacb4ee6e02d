"""The gateway side local providers share: the worker process client, the checkpoint provider."""
