#!/usr/bin/env bash
# The browser CI lane: report.html opened in headless Chromium (Debian's `chromium` package).
# It fails on a console error or an image that did not render, and keeps the screenshot as a CI
# artefact ($BI_PROPS_BROWSER_OUT/report.png, default build/browser/report.png; docs/report.png
# is a copy of it). Reuses the main .venv. Without Chromium, and no way to install it, the lane
# FAILS: it never skips.
#
#   scripts/ci_browser_lane.sh [all|setup|tests]     (default: all; `setup` only installs
#   Chromium, which .ci/run does in the background beside the main suite)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export BI_PROPS_BROWSER_OUT="${BI_PROPS_BROWSER_OUT:-build/browser}"
phase="${1:-all}"
case "$phase" in
    all | setup | tests) ;;
    *) echo "usage: $0 [all|setup|tests]" >&2; exit 2 ;;
esac

if [ "$phase" != tests ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -q || true
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium; then
    echo "ci_browser_lane: cannot install chromium with apt-get (Debian package 'chromium');" \
      "install it and re-run scripts/ci_browser_lane.sh" >&2
    exit 1
  fi
fi
if [ "$phase" = setup ]; then
    exit 0
fi
if ! command -v chromium >/dev/null 2>&1; then
    echo "ci_browser_lane: chromium is missing (run scripts/ci_browser_lane.sh setup)" >&2
    exit 1
fi
chromium --version

# shellcheck disable=SC1091
. .venv/bin/activate
python -m pytest tests/browser_lane/lane_browser.py -p no:cacheprovider -q
echo "ci_browser_lane: screenshot at $BI_PROPS_BROWSER_OUT/report.png"
