"""Devices: the layer IR, cost models and their specs."""
