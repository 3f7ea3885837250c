"""The browser lane's tests run only through scripts/ci_browser_lane.sh (files named lane_*.py
are not collected by the main suite)."""
