"""The controller side: sessions, fuzz campaigns, their scheduler and ledger, and the Ray runner.

Runs in the controller (pytest or ``bi-props fuzz``); drives workers through ``bi_props.runner``.
"""
