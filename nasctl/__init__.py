"""nasctl: hardware-aware neural architecture search from the command line."""

__version__ = "0.1.0"
