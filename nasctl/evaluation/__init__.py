"""Accuracy of candidates by real proxy training: datasets, quantization-aware training,
early-exit threshold calibration and evaluation."""
