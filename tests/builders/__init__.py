"""Builders of tiny random model checkpoints for tests; nothing here downloads anything."""
