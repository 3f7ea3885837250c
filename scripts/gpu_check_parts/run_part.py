"""Run one part of scripts/gpu_check.sh with a hard time limit that kills all of it.

    python3 scripts/gpu_check_parts/run_part.py [--here] [--tee] PART_DIR LIMIT_S -- COMMAND...

The command runs in its own session (so its process group is one signal away) with the part's
marker ``BI_PROPS_GPU_CHECK_PART=<PART_DIR>:<random>`` in its environment, its temporary files
(bi_props' worker logs) in ``PART_DIR/tmp`` and Hypothesis' data in ``PART_DIR/hypothesis``;
its stdout and stderr go to ``PART_DIR/log`` (``--tee``: and to this stdout); it runs in
``PART_DIR`` (``--here``: in the current folder). bi_props' controller starts every worker with
``start_new_session=True``, so killing the part's group does not reach them: after the group,
every process whose environment carries the marker (read from ``/proc/*/environ``) is killed
too, each with its own process group, until none is left. ``PART_DIR/part.json`` records the
exit code, whether the limit cut the part, the pids killed and any that survived.

Exit status: the command's, 124 when the limit cut it (as ``timeout`` does).
Needs Linux (/proc) and Python 3.9+; nothing else.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MARKER = "BI_PROPS_GPU_CHECK_PART"
GRACE_S = 5.0


def marked(marker: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment holds ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def _signal_group_and_pid(pid: int, sig: int) -> None:
    for kill in (lambda: os.killpg(os.getpgid(pid), sig), lambda: os.kill(pid, sig)):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


def kill_tree(leader: subprocess.Popen, marker: str, grace_s: float = GRACE_S) -> list[int]:
    """TERM the part's group and every marked process, KILL what is left after ``grace_s``,
    repeat until no marked process lives (a dying controller may start one more worker)."""
    killed: set[int] = set()
    targets = marked(marker)
    killed.update(targets)
    _signal_group_and_pid(leader.pid, signal.SIGTERM)
    for pid in targets:
        _signal_group_and_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (leader.poll() is None or marked(marker)):
        time.sleep(0.1)
    for _ in range(50):
        _signal_group_and_pid(leader.pid, signal.SIGKILL)
        left = marked(marker)
        if not left and leader.poll() is not None:
            break
        killed.update(left)
        for pid in left:
            _signal_group_and_pid(pid, signal.SIGKILL)
        time.sleep(0.1)
    try:
        leader.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return sorted(killed)


def _copy(source, log, echo: bool) -> None:
    for chunk in iter(lambda: source.read1(65536), b""):
        log.write(chunk)
        log.flush()
        if echo:
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()


def run(
    part_dir: Path, limit_s: float, command: list[str], here: bool = False, tee: bool = False
) -> int:
    part_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("tmp", "hypothesis"):
        (part_dir / sub).mkdir(exist_ok=True)
    marker = f"{part_dir.name}:{secrets.token_hex(6)}"
    env = dict(os.environ)
    env[MARKER] = marker
    env["TMPDIR"] = str(part_dir / "tmp")
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(part_dir / "hypothesis")
    started = time.monotonic()
    with open(part_dir / "log", "ab") as log:
        leader = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=None if here else str(part_dir), start_new_session=True,
        )  # fmt: skip
        copier = threading.Thread(target=_copy, args=(leader.stdout, log, tee), daemon=True)
        copier.start()
        try:
            code = leader.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        killed: list[int] = []
        if timed_out or marked(marker):  # cut, or it left workers behind: kill all of it
            killed = kill_tree(leader, marker)
        copier.join(timeout=10)  # a killed tree closes the pipe; a worker holding it is dead too
        if timed_out:
            code = 124
            cut_line = f"run_part: {part_dir.name}: part cut after {limit_s:g} s; killed {killed}"
            if tee:
                print(cut_line, flush=True)
            log.write(f"\n{cut_line}\n".encode())
    survivors = marked(marker)
    record = {
        "command": command,
        "limit_s": limit_s,
        "seconds": round(time.monotonic() - started, 1),
        "exit": code,
        "timed_out": timed_out,
        "marker": marker,
        "killed": killed,
        "survivors": survivors,
    }
    (part_dir / "part.json").write_text(json.dumps(record, indent=2))
    return code


def main(argv: list[str]) -> int:
    flags = {"--here": False, "--tee": False}
    while argv and argv[0] in flags:
        flags[argv.pop(0)] = True
    if len(argv) < 4 or argv[2] != "--":
        print("usage: " + __doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    return run(Path(argv[0]).resolve(), float(argv[1]), argv[3:], flags["--here"], flags["--tee"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
