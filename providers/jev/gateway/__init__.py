"""Jev, gateway side: runs in the gateway process and never imports torch."""
