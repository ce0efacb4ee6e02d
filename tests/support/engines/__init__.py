"""Torch-free engines that worker tests load through `decidealot.providers.engine`."""
