"""A fifth provider, registered from outside the package through its descriptor alone.

Nothing in `decidealot` names it: a distribution's metadata (written by the test into a
folder on the path) registers `descriptor.DESCRIPTOR` in the `decidealot.providers` entry-point
group, and the service, its settings, startup checks, catalog and MCP tools take it from there.
"""
