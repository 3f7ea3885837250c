import os

pytest_plugins = ["pytester"]

# The `switching` property spawns an interpreter per pytest session of a two-way module target at
# its end; the many suite runs of this test suite leave it out (tests/test_switching.py turns it
# back on where it is what is tested).
os.environ.setdefault("BI_PROPS_SWITCHING", "0")
