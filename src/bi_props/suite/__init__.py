"""The property suite users collect: ``pytest --pyargs bi_props --hypothesis-profile=...``."""
