"""Open an HTML page in headless Chromium (Debian's package) and say what a reader would miss:
images that did not load or decode, console errors, script errors. A string check of the HTML
cannot see these; the browser can."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

# Injected first in <head>: records load failures (capture phase sees <img> errors), script
# errors and console.error, then after `load` checks every image and writes the result into the
# DOM, which --dump-dom prints.
PROBE = """<script>
window.__biProblems = [];
window.addEventListener('error', function (e) {
  var t = e.target;
  if (t && t.tagName) {
    window.__biProblems.push('failed to load <' + t.tagName.toLowerCase() + '> '
      + String(t.currentSrc || t.src || '').slice(0, 60));
  } else {
    window.__biProblems.push('script error: ' + e.message);
  }
}, true);
var __biConsoleError = console.error;
console.error = function () {
  window.__biProblems.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
  __biConsoleError.apply(console, arguments);
};
window.addEventListener('load', function () {
  var images = document.images;
  for (var i = 0; i < images.length; i++) {
    if (!(images[i].complete && images[i].naturalWidth > 0)) {
      window.__biProblems.push('image ' + i + ' (' + images[i].alt + ') did not render');
    }
  }
  var out = document.createElement('pre');
  out.id = 'bi-props-browser-check';
  out.textContent = JSON.stringify({images: images.length, problems: window.__biProblems});
  document.body.appendChild(out);
});
</script>"""
RESULT = re.compile(r'<pre id="bi-props-browser-check">(.*?)</pre>', re.S)
CONSOLE = re.compile(r":CONSOLE[:(\d]")


def chromium() -> str:
    """The Chromium binary; the lane installs it, so its absence is a failure, not a skip."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "chromium not found: install it (apt-get install -y chromium) or run "
        "scripts/ci_browser_lane.sh, which does"
    )


def _run(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    command = [chromium(), "--headless", "--disable-gpu", "--no-sandbox", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def problems(page: Path) -> tuple[int, list[str]]:
    """(images on the page, what went wrong) for ``page`` opened in Chromium."""
    text = page.read_text()
    probed = page.with_name(page.stem + ".probed.html")
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    done = _run(
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probed.resolve().as_uri(),
    )
    found = RESULT.search(done.stdout)
    if not found:
        return 0, [f"the page never finished loading (chromium exit {done.returncode})"]
    result = json.loads(html.unescape(found.group(1)))
    console = [line for line in done.stderr.splitlines() if CONSOLE.search(line)]
    return result["images"], result["problems"] + [f"console: {line}" for line in console]


def screenshot(page: Path, png: Path, size: str = "1280,2000") -> None:
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    done = _run(f"--screenshot={png.resolve()}", f"--window-size={size}", page.resolve().as_uri())
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr}")
