"""Jev: TypeSafe's hosted System One API, passed through; it runs in the gateway only."""
