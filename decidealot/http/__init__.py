"""HTTP transport: the Litestar app and the granian server that runs it."""

from decidealot.http.app import create_app

__all__ = ["create_app"]
