"""Torch-free engines that worker tests load through `providers.worker`."""
