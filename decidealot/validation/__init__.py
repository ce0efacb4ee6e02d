"""The one System One validator: strict JSON, then the request rules."""
