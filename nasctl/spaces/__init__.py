"""Search spaces: the base contract, the declarative (YAML) kinds, encodings."""
