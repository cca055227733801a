"""An example nasctl plugin: the `tcn1d` search-space kind (1-D convolutional networks
over sequences), the `mcu-roofline` device kind, and a spec file of each
(search_spaces/tcn-digits.yaml, hardware/m4-roofline.yaml)."""

__version__ = "0.1.0"
