"""Decidealot: System One decisions over one TypeSafe-compatible HTTP and MCP contract."""

__version__ = "0.1.0"
