"""The ``bi-props`` command: fuzz | doctor.

Exit status: 0 clean, 1 findings (or, for doctor, a target that cannot run), 2 usage errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .profiles import DEFAULT_TARGETS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bi-props",
        description="Property-based differential tester for batch-invariant kernels",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fuzz = sub.add_parser("fuzz", help="run every property on a target within a time budget")
    fuzz.add_argument("--target", default=None, help="cpu, vllm, ascend, or some.module[:attr]")
    fuzz.add_argument("--budget", type=float, default=60.0, metavar="SECONDS")
    fuzz.add_argument("--out", type=Path, default=Path("bi_props-out"), metavar="DIR")
    fuzz.add_argument("--ops", default=None, help="comma-separated catalogue ops (default: all)")
    fuzz.add_argument("--profile", default="cpu", help="bundled search space to use")
    fuzz.add_argument("--strategies", type=Path, default=None, help="a search-space TOML file")
    doctor = sub.add_parser("doctor", help="what a target needs and what is here")
    doctor.add_argument("--target", default="cpu")
    return parser


def _space(args: argparse.Namespace):
    from dataclasses import replace

    from .catalogue import OPS
    from .space import SpaceError, load, load_profile

    try:
        space = (
            load(args.strategies, args.profile) if args.strategies else load_profile(args.profile)
        )
    except SpaceError as exc:
        raise SystemExit(_usage(f"bad strategies file: {exc}")) from None
    if args.ops:
        ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
        unknown = [o for o in ops if o not in OPS]
        if unknown:
            raise SystemExit(_usage(f"--ops: unknown {unknown}; the catalogue has {list(OPS)}"))
        space = replace(space, ops=ops)
    return space


def _usage(message: str) -> int:
    print(f"bi-props: error: {message}", file=sys.stderr)
    return 2


def _fuzz(args: argparse.Namespace) -> int:
    from .fuzz import fuzz
    from .runner.controller import WorkerFailure
    from .session import Session

    if args.budget <= 0:
        return _usage("--budget must be positive")
    space = _space(args)
    target = args.target or space.target or DEFAULT_TARGETS.get(args.profile)
    if not target:
        return _usage(f"profile {args.profile!r} names no target: pass --target")
    session = Session(target, space)
    try:
        return fuzz(session, args.budget, args.out)
    except WorkerFailure as exc:
        print(
            f"bi-props: the worker for target {target!r} failed to start:\n{exc}", file=sys.stderr
        )
        return 2


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    return doctor(args.target)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "fuzz":
        return _fuzz(args)
    return _doctor(args)


if __name__ == "__main__":
    sys.exit(main())
