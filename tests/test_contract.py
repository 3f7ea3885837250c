"""Tests of the ascend adapter's source contract check (bi_props/integrations/contract.py).

Against the real vllm-ascend 0.23.0 wheel from PyPI: set BI_PROPS_VLLM_ASCEND_SRC to an unpacked
tree (``scripts/fetch_vllm_ascend_wheel.sh DIR``), or let the fixture download it once per session.
A failed download FAILS the test (no silent skip: a check that never runs protects nothing).
Negative tests use a small synthetic tree written here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bi_props.integrations.contract import (
    Problem,
    check_contract,
    check_installed,
    main,
    package_dir,
    read_version,
    source_registrations,
)
from bi_props.targets.ascend_routes import CALL_USES, Capabilities, registrations

ROOT = Path(__file__).resolve().parents[1]
FETCH = ROOT / "scripts" / "fetch_vllm_ascend_wheel.sh"
SRC_ENV = "BI_PROPS_VLLM_ASCEND_SRC"
BI_FILE = "vllm_ascend/batch_invariant.py"


@pytest.fixture(scope="session")
def vllm_ascend_src(tmp_path_factory) -> Path:
    given = os.environ.get(SRC_ENV)
    if given:
        if package_dir(Path(given)) is None:
            pytest.fail(f"{SRC_ENV}={given!r} holds no vllm_ascend package")
        return Path(given)
    target = tmp_path_factory.mktemp("vllm_ascend_0.23.0")
    env = {**os.environ, "PYTHON": sys.executable}
    try:
        done = subprocess.run(
            ["bash", str(FETCH), str(target), "0.23.0"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("downloading vllm-ascend 0.23.0 from PyPI timed out")
    if done.returncode != 0:
        pytest.fail(
            "could not download vllm-ascend 0.23.0 from PyPI for the contract check; set"
            f" {SRC_ENV} to an unpacked tree (scripts/fetch_vllm_ascend_wheel.sh DIR).\n"
            f"{done.stderr[-3000:]}"
        )
    return target


# ---------------------------------------------------------------------------------------------
# The real 0.23.0 wheel


def test_real_wheel_meets_the_contract(vllm_ascend_src):
    pkg = package_dir(vllm_ascend_src)
    assert pkg is not None and (pkg / "batch_invariant.py").is_file()
    if not os.environ.get(SRC_ENV):
        assert read_version(pkg) == "0.23.0"
    assert check_contract(vllm_ascend_src) == []


def test_real_wheel_registrations_are_the_routing_table(vllm_ascend_src):
    """The interpreter reads enable_batch_invariant_mode() of the wheel for each capability pair
    and finds exactly the routing table's registrations (non-vacuous: 10 with both backends)."""
    version = read_version(package_dir(vllm_ascend_src))
    counts = {}
    for ascendc in (True, False):
        for triton in (True, False):
            found = [
                (r.target, r.implementation)
                for r in source_registrations(vllm_ascend_src, ascendc, triton)
            ]
            table = [
                (r.target, r.implementation)
                for r in registrations(Capabilities(ascendc, triton, version))
            ]
            assert sorted(found) == sorted(table)
            counts[ascendc, triton] = len(found)
    if version == "0.23.0":
        assert counts == {(True, True): 10, (True, False): 6, (False, True): 7, (False, False): 0}


def test_contract_cli(vllm_ascend_src, capsys):
    assert main([str(vllm_ascend_src)]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# A synthetic tree: good as written, then broken one way at a time

GOOD = {
    "vllm_ascend/__init__.py": "",
    "vllm_ascend/_version.py": "__version__ = version = '0.23.0'\n",
    "vllm_ascend/ascend_config.py": """
        _CONFIG = None

        def get_ascend_config():
            if _CONFIG is None:
                raise RuntimeError("no engine")
            return _CONFIG
    """,
    "vllm_ascend/ops/__init__.py": "",
    "vllm_ascend/ops/triton/__init__.py": "",
    "vllm_ascend/ops/triton/batch_invariant/__init__.py": "",
    "vllm_ascend/ops/triton/batch_invariant/matmul.py": """
        def mm_batch_invariant(a, b): ...
        def bmm_batch_invariant(a, b): ...
        def addmm_batch_invariant(c, a, b): ...
        def matmul_batch_invariant(a, b): ...
        def linear_batch_invariant(x, w, b=None): ...
    """,
    "vllm_ascend/ops/triton/batch_invariant/softmax.py": """
        def softmax_batch_invariant(x, dim, dtype=None): ...
    """,
    "vllm_ascend/attention/__init__.py": "",
    "vllm_ascend/attention/backend.py": """
        import torch_npu

        def prefill(q, k, v, mask, ends, n, nkv, s):
            return torch_npu.npu_fused_infer_attention_score(
                query=q, key=k, value=v, atten_mask=mask, block_table=None, input_layout="TND",
                block_size=128, actual_seq_lengths=ends, actual_seq_lengths_kv=ends,
                num_key_value_heads=nkv, num_heads=n, scale=s, sparse_mode=3)
    """,
    # The engine adapters' call sites (ascend_routes.CALL_USES), as vllm-ascend 0.23.0 has them.
    "vllm_ascend/ops/layernorm.py": """
        class AscendRMSNorm:
            def forward_oot(self, x, residual=None):
                import torch_npu

                if residual is not None:
                    x, _, residual = torch_npu.npu_add_rms_norm(x, residual, self.weight, self.eps)
                    return x, residual
                x, residual = torch_npu.npu_rms_norm(x, self.weight, self.eps)
                return x
    """,
    "vllm_ascend/ops/activation.py": """
        import torch_npu

        class AscendSiluAndMul:
            def forward_oot(self, x):
                return torch_npu.npu_swiglu(x)
    """,
    "vllm_ascend/ops/rotary_embedding.py": """
        def rope_forward_oot(positions, query, key, cos_sin_cache, head_size, rotary_dim,
                             is_neox_style, offsets=None):
            return query, key
    """,
    "vllm_ascend/attention/attention_v1.py": """
        from vllm_ascend.device.device_op import DeviceOperator

        class Impl:
            def forward_fused_infer_attention(self, query, key, value, m, output):
                out, _ = DeviceOperator.npu_fused_infer_attention_score(
                    query=query, key=key, value=value, atten_mask=m.attn_mask,
                    block_table=m.block_tables, input_layout="TND", block_size=128,
                    actual_seq_lengths=m.q, actual_seq_lengths_kv=m.kv,
                    num_key_value_heads=self.nkv, num_heads=self.n, head_size=self.d,
                    scale=self.scale, sparse_mode=3)
                if not m.causal:
                    out, _ = DeviceOperator.npu_fused_infer_attention_score(
                        query=query, key=key, value=value, block_table=m.block_tables,
                        input_layout="TND", block_size=128, actual_seq_lengths=m.q,
                        actual_seq_lengths_kv=m.kv, num_key_value_heads=self.nkv,
                        num_heads=self.n, scale=self.scale, sparse_mode=0)
                return out
    """,
    "vllm_ascend/device/__init__.py": "",
    "vllm_ascend/device/device_op.py": """
        import torch_npu

        class A5DeviceAdaptor:
            @classmethod
            def npu_fused_infer_attention_score(cls, query, key, value, m, *, num_heads,
                                                num_key_value_heads, scale, **kwargs):
                return torch_npu.npu_fused_infer_attention_score(
                    query=query, key=key.contiguous(), value=value.contiguous(),
                    num_key_value_heads=num_key_value_heads, num_heads=num_heads, scale=scale,
                    **kwargs)

            @staticmethod
            def moe_gating_top_k(x, *, k, k_group, group_count, group_select_mode, renorm,
                                 norm_type, out_flag, routed_scaling_factor=1.0, eps=1e-20,
                                 bias_opt=None):
                return torch_npu.npu_moe_gating_top_k(
                    x, k=k, bias=bias_opt, k_group=k_group, group_count=group_count,
                    group_select_mode=group_select_mode, renorm=0, norm_type=norm_type,
                    routed_scaling_factor=routed_scaling_factor, eps=eps)

            @staticmethod
            def npu_moe_init_routing(hidden_states, topk_ids, *, scale=None, active_num,
                                     expert_num, expert_tokens_num_type=1,
                                     expert_tokens_num_flag=True, active_expert_range=None,
                                     quant_mode=-1):
                return torch_npu.npu_moe_init_routing_v2(
                    hidden_states, topk_ids, scale=scale, active_num=active_num,
                    expert_num=expert_num, expert_tokens_num_type=expert_tokens_num_type,
                    expert_tokens_num_flag=expert_tokens_num_flag,
                    active_expert_range=active_expert_range, quant_mode=quant_mode)

            @staticmethod
            def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs):
                return torch_npu.npu_moe_token_unpermute(
                    permuted_tokens=permuted_tokens, sorted_indices=sorted_indices, probs=probs)

        DeviceOperator = A5DeviceAdaptor
    """,
    "vllm_ascend/ops/fused_moe/__init__.py": "",
    "vllm_ascend/ops/fused_moe/experts_selector.py": """
        from vllm_ascend.device.device_op import DeviceOperator

        def _select_experts_with_fusion_ops(router_logits, top_k, renorm, norm_type):
            return DeviceOperator.moe_gating_top_k(
                router_logits, k=top_k, k_group=1, group_count=1, group_select_mode=1,
                renorm=renorm, norm_type=norm_type, out_flag=False, routed_scaling_factor=1.0,
                eps=1e-20, bias_opt=None)
    """,
    "vllm_ascend/ops/fused_moe/token_dispatcher.py": """
        from vllm_ascend.device.device_op import DeviceOperator

        class TokenDispatcherWithAllGather:
            def token_dispatch(self, hidden_states, topk_ids, n, e):
                return DeviceOperator.npu_moe_init_routing(
                    hidden_states, topk_ids, scale=None, active_num=n, expert_num=e,
                    expert_tokens_num_type=1, expert_tokens_num_flag=True,
                    active_expert_range=[0, e], quant_mode=-1)
    """,
    "vllm_ascend/ops/fused_moe/moe_mlp.py": """
        import torch_npu

        def unquant_apply_mlp(hidden_states, w1, w2, group_list, group_list_type=1):
            out = torch_npu.npu_grouped_matmul(
                x=[hidden_states], weight=[w1], split_item=2, group_list_type=group_list_type,
                group_type=0, group_list=group_list)[0]
            out = torch_npu.npu_swiglu(out)
            return torch_npu.npu_grouped_matmul(
                x=[out], weight=[w2], split_item=2, group_list_type=group_list_type,
                group_type=0, group_list=group_list)[0]
    """,
    BI_FILE: """
        import os

        import torch
        import torch_npu
        import vllm.envs as envs
        from vllm.triton_utils import HAS_TRITON

        if HAS_TRITON:
            from vllm_ascend.ops.triton.batch_invariant.matmul import (
                addmm_batch_invariant, bmm_batch_invariant, linear_batch_invariant,
                matmul_batch_invariant, mm_batch_invariant)
            from vllm_ascend.ops.triton.batch_invariant.softmax import softmax_batch_invariant

        try:
            import batch_invariant_ops
            HAS_ASCENDC_BATCH_INVARIANT = True
        except ImportError:
            HAS_ASCENDC_BATCH_INVARIANT = False

        def add_rms_norm(x, residual, weight, eps):
            return x, None, residual

        def reduce_sum(x, dim=None, keepdim=False):
            return x

        def override_envs_for_invariance():
            from vllm_ascend.ascend_config import get_ascend_config
            config = get_ascend_config()
            config.weight_nz_mode = 0
            config.enable_matmul_allreduce = False
            os.environ["HCCL_DETERMINISTIC"] = "strict"

        _batch_invariant_LIB = None

        def enable_batch_invariant_mode():
            global _batch_invariant_LIB
            _batch_invariant_LIB = torch.library.Library("aten", "IMPL")
            if HAS_TRITON:
                _batch_invariant_LIB.impl("aten::addmm", addmm_batch_invariant, "NPU")
                _batch_invariant_LIB.impl("aten::bmm", bmm_batch_invariant, "NPU")
                _batch_invariant_LIB.impl("aten::softmax", softmax_batch_invariant, "NPU")
                _batch_invariant_LIB.impl("aten::_softmax", softmax_batch_invariant, "NPU")
            if HAS_ASCENDC_BATCH_INVARIANT:
                _batch_invariant_LIB.impl(
                    "aten::mm", torch.ops.batch_invariant_ops.npu_mm_batch_invariant, "NPU")
                _batch_invariant_LIB.impl(
                    "aten::matmul",
                    torch.ops.batch_invariant_ops.npu_matmul_batch_invariant,
                    "NPU",
                )
                _batch_invariant_LIB.impl(
                    "aten::sum",
                    torch.ops.batch_invariant_ops.npu_reduce_sum_batch_invariant,
                    "NPU",
                )
                torch_npu.npu_fused_infer_attention_score = (
                    torch.ops.batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant)
                torch_npu.npu_add_rms_norm = add_rms_norm
                torch.sum = reduce_sum
            elif HAS_TRITON:
                _batch_invariant_LIB.impl("aten::mm", mm_batch_invariant, "NPU")
                _batch_invariant_LIB.impl("aten::matmul", matmul_batch_invariant, "NPU")
                _batch_invariant_LIB.impl("aten::linear", linear_batch_invariant, "NPU")

        def init_batch_invariance():
            if envs.VLLM_BATCH_INVARIANT:
                if HAS_TRITON or HAS_ASCENDC_BATCH_INVARIANT:
                    override_envs_for_invariance()
                    enable_batch_invariant_mode()
                else:
                    print("warning: nothing to enable")
    """,
}


def write_tree(root: Path, **changes: tuple[str, str] | str | None) -> Path:
    """The GOOD tree with ``changes``: file -> None (delete), text, or (old, new) replacement."""
    files = {name: textwrap.dedent(text) for name, text in GOOD.items()}
    for key, change in changes.items():
        name = {
            "bi": BI_FILE,
            "config": "vllm_ascend/ascend_config.py",
            "attention": "vllm_ascend/attention/backend.py",
        }.get(key, key)
        if change is None:
            files.pop(name)
        elif isinstance(change, tuple):
            old, new = change
            assert old in files[name], old
            files[name] = files[name].replace(old, new)
        else:
            files[name] = textwrap.dedent(change)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]


def test_synthetic_good_tree_meets_the_contract(tmp_path):
    assert check_contract(write_tree(tmp_path)) == []
    assert check_contract(write_tree(tmp_path) / "vllm_ascend") == []  # the package dir itself


def test_missing_init_batch_invariance(tmp_path):
    tree = write_tree(tmp_path, bi=("def init_batch_invariance():", "def _init():"))
    problem = only([p for p in check_contract(tree) if p.symbol == "init_batch_invariance"])
    assert problem.file == BI_FILE
    assert "missing" in problem.message
    assert "init_batch_invariance" in str(problem) and BI_FILE in str(problem)


def test_changed_signature_of_init(tmp_path):
    tree = write_tree(
        tmp_path, bi=("def init_batch_invariance():", "def init_batch_invariance(vllm_config):")
    )
    problem = only(check_contract(tree))
    assert (problem.file, problem.symbol) == (BI_FILE, "init_batch_invariance")
    assert "vllm_config" in problem.message and "the adapter calls ()" in problem.message


def test_renamed_parameter_of_add_rms_norm(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            "def add_rms_norm(x, residual, weight, eps):",
            "def add_rms_norm(x, residual, gamma, eps):",
        ),
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "add_rms_norm"
    assert "(x, residual, weight, eps)" in problem.message and "gamma" in problem.message


def test_changed_default_of_reduce_sum(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            "def reduce_sum(x, dim=None, keepdim=False):",
            "def reduce_sum(x, dim=-1, keepdim=False):",
        ),
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "reduce_sum" and "default of 'dim' changed" in problem.message


def test_extra_optional_parameters_are_accepted(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            "def reduce_sum(x, dim=None, keepdim=False):",
            "def reduce_sum(x, dim=None, keepdim=False, *, dtype=None):",
        ),
    )
    assert check_contract(tree) == []


def test_missing_capability_flag(tmp_path):
    tree = write_tree(tmp_path, bi=("from vllm.triton_utils import HAS_TRITON\n", ""))
    symbols = {p.symbol for p in check_contract(tree)}
    assert "HAS_TRITON" in symbols


def test_registration_drift_is_reported(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            "        torch.sum = reduce_sum\n",
            "        torch.sum = reduce_sum\n"
            "        _batch_invariant_LIB.impl('aten::linear', linear_batch_invariant, 'NPU')\n",
        ),
    )
    problems = [p for p in check_contract(tree) if p.symbol == "enable_batch_invariant_mode"]
    assert problems and all("aten::linear" in p.message for p in problems)
    assert any("HAS_ASCENDC_BATCH_INVARIANT=True, HAS_TRITON=True" in p.message for p in problems)


def test_removed_registration_is_reported(tmp_path):
    tree = write_tree(tmp_path, bi=("        torch_npu.npu_add_rms_norm = add_rms_norm\n", ""))
    problems = check_contract(tree)
    assert any("expects torch_npu.npu_add_rms_norm" in p.message for p in problems)


def test_other_dispatch_key_is_reported(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            '"aten::bmm", bmm_batch_invariant, "NPU"',
            '"aten::bmm", bmm_batch_invariant, "PrivateUse1"',
        ),
    )
    assert any("'PrivateUse1'" in p.message for p in check_contract(tree))


def test_init_that_ignores_the_switch_is_reported(tmp_path):
    tree = write_tree(tmp_path, bi=("    if envs.VLLM_BATCH_INVARIANT:", "    if True:"))
    problems = [p for p in check_contract(tree) if p.symbol == "init_batch_invariance"]
    assert problems and all("switch off" in p.message for p in problems)


def test_uninterpretable_condition_is_reported(tmp_path):
    tree = write_tree(
        tmp_path, bi=("    if HAS_TRITON:\n        _batch", "    if some_probe():\n        _batch")
    )
    assert any("cannot interpret" in p.message for p in check_contract(tree))


def test_config_getter_from_elsewhere_is_reported(tmp_path):
    tree = write_tree(
        tmp_path,
        bi=(
            "from vllm_ascend.ascend_config import get_ascend_config",
            "from vllm_ascend.config import get_ascend_config",
        ),
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "override_envs_for_invariance"
    assert "vllm_ascend.config.get_ascend_config" in problem.message


def test_config_attribute_outside_the_stand_in_is_reported(tmp_path):
    tree = write_tree(
        tmp_path, bi=("config.weight_nz_mode = 0", "config.weight_nz_mode = config.nz_default")
    )
    problem = only(check_contract(tree))
    assert "'nz_default'" in problem.message


def test_missing_config_module_is_reported(tmp_path):
    problem = only(check_contract(write_tree(tmp_path, config=None)))
    assert (problem.file, problem.symbol) == ("vllm_ascend/ascend_config.py", "get_ascend_config")
    assert "module missing" in problem.message


def test_missing_triton_implementation_is_reported(tmp_path):
    tree = write_tree(tmp_path, **{"vllm_ascend/ops/triton/batch_invariant/softmax.py": "\n"})
    problem = only(check_contract(tree))
    assert problem.symbol == "softmax_batch_invariant"
    assert problem.file == "vllm_ascend/ops/triton/batch_invariant/softmax.py"


def test_attention_keywords_are_checked(tmp_path):
    """Without actual_seq_lengths_kv in any call of the tree, the varlen entry's check and the
    checks of the two adapters that mirror forward_fused_infer_attention's calls (paged decode;
    the mixed batch, causal and not) fail, each naming its file."""
    tree = write_tree(
        tmp_path,
        attention=("actual_seq_lengths_kv=ends,", ""),
        **{ATTN_V1: ("actual_seq_lengths_kv=m.kv,", "")},
    )
    problems = check_contract(tree)
    assert len(problems) == 4, problems
    for adapter in ("npu_paged_decode_attention", "npu_mixed_attention"):
        assert any(adapter in p.message for p in problems), (adapter, problems)
    assert all(p.symbol == "npu_fused_infer_attention_score" for p in problems)
    assert all("actual_seq_lengths_kv" in p.message for p in problems)
    assert any("backend.py" in p.message for p in problems)
    assert any(
        p.file == ATTN_V1 and "forward_fused_infer_attention()" in p.message for p in problems
    )


# ---------------------------------------------------------------------------------------------
# The engine adapters' calls (ascend_routes.CALL_USES), on doctored copies of the GOOD tree

ATTN_V1 = "vllm_ascend/attention/attention_v1.py"
DEVICE_OP = "vllm_ascend/device/device_op.py"


def test_every_call_use_is_found_in_the_good_tree_and_in_the_wheel_files():
    """Non-vacuous: each CallUse names a file the 0.23.0 wheel has and the GOOD tree mirrors."""
    files = {f for use in CALL_USES for f in use.files}
    assert files <= set(GOOD), files - set(GOOD)
    assert len(CALL_USES) >= 12


def test_renamed_npu_function_fails(tmp_path):
    tree = write_tree(
        tmp_path,
        **{"vllm_ascend/ops/activation.py": ("npu_swiglu(x)", "npu_swiglu_v2(x)")},
    )
    problem = only(check_contract(tree))
    assert (problem.file, problem.symbol) == ("vllm_ascend/ops/activation.py", "npu_swiglu")
    assert "no call of it found" in problem.message and "npu_silu_and_mul" in problem.message


def test_missing_keyword_fails_and_names_the_closest_call(tmp_path):
    tree = write_tree(
        tmp_path,
        **{DEVICE_OP: ("permuted_tokens=permuted_tokens, ", "")},
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "npu_moe_token_unpermute"
    assert "without ['permuted_tokens']" in problem.message
    assert "device_op.py:" in problem.message  # the closest call, with its line


def test_changed_mode_fails(tmp_path):
    """Both adapters that mirror the causal call rely on its mode; each says so."""
    tree = write_tree(tmp_path, **{ATTN_V1: ("sparse_mode=3", "sparse_mode=4")})
    problems = check_contract(tree)
    assert len(problems) == 2, problems
    assert {p.file for p in problems} == {ATTN_V1}
    assert all("sparse_mode=4, not 3" in p.message for p in problems)
    for adapter in ("npu_paged_decode_attention", "npu_mixed_attention"):
        assert any(adapter in p.message for p in problems), (adapter, problems)


def test_a_mode_of_another_type_fails(tmp_path):
    """``expert_tokens_num_flag=1`` is not the literal True the adapter passes."""
    tree = write_tree(
        tmp_path,
        **{
            "vllm_ascend/ops/fused_moe/token_dispatcher.py": (
                "expert_tokens_num_flag=True",
                "expert_tokens_num_flag=1",
            )
        },
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "npu_moe_init_routing"
    assert "expert_tokens_num_flag=1, not True" in problem.message


def test_other_positional_count_fails(tmp_path):
    tree = write_tree(
        tmp_path,
        **{
            "vllm_ascend/ops/layernorm.py": (
                "torch_npu.npu_rms_norm(x, self.weight, self.eps)",
                "torch_npu.npu_rms_norm(x, self.weight, epsilon=self.eps)",
            )
        },
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "npu_rms_norm" and "2 positional, not 3" in problem.message


def test_call_outside_the_named_function_does_not_count(tmp_path):
    tree = write_tree(
        tmp_path,
        **{"vllm_ascend/ops/fused_moe/moe_mlp.py": ("def unquant_apply_mlp(", "def other_mlp(")},
    )
    problems = check_contract(tree)
    assert {p.symbol for p in problems} == {"npu_grouped_matmul", "npu_swiglu"}
    assert all("unquant_apply_mlp()" in p.message for p in problems)


def test_missing_adapter_file_fails_loudly(tmp_path):
    tree = write_tree(tmp_path, **{DEVICE_OP: None})
    problems = check_contract(tree)
    symbols = {p.symbol for p in problems if p.file == DEVICE_OP}
    assert {
        "npu_fused_infer_attention_score",
        "npu_moe_gating_top_k",
        "npu_moe_init_routing_v2",
        "npu_moe_token_unpermute",
    } <= symbols
    assert all("module missing" in p.message for p in problems if p.file == DEVICE_OP)


def test_renamed_rope_forward_fails(tmp_path):
    tree = write_tree(
        tmp_path,
        **{
            "vllm_ascend/ops/rotary_embedding.py": (
                "is_neox_style, offsets=None",
                "is_neox, offsets=None",
            )
        },
    )
    problem = only(check_contract(tree))
    assert problem.symbol == "rope_forward_oot" and "is_neox_style" in problem.message


def test_engine_adapters_are_not_required_before_0_23(tmp_path):
    """The adapters were read in 0.23.0: an older tree is not held to their call sites."""
    tree = write_tree(tmp_path, **{DEVICE_OP: None, "vllm_ascend/ops/rotary_embedding.py": None})
    assert check_contract(tree, version="0.22.0") == []
    assert check_contract(tree, version="0.23.0") != []


def test_doctored_copy_of_the_real_wheel_fails(vllm_ascend_src, tmp_path):
    """The real 0.23.0 source with one adapter call changed: the check fails on exactly it."""
    import shutil

    copy = tmp_path / "wheel"
    shutil.copytree(package_dir(vllm_ascend_src), copy / "vllm_ascend")
    for info in Path(vllm_ascend_src).glob("vllm_ascend-*.dist-info"):
        shutil.copytree(info, copy / info.name)
    activation = copy / "vllm_ascend" / "ops" / "activation.py"
    text = activation.read_text()
    assert text.count("torch_npu.npu_swiglu(x)") == 2
    activation.write_text(text.replace("torch_npu.npu_swiglu(x)", "torch_npu.npu_swiglu(x, -1)"))
    problem = only(check_contract(copy, version="0.23.0"))
    assert problem.symbol == "npu_swiglu" and "2 positional, not 1" in problem.message


def test_no_package_and_unknown_version(tmp_path):
    problem = only(check_contract(tmp_path))
    assert problem.symbol == "vllm_ascend" and "no vllm_ascend package" in problem.message
    tree = write_tree(tmp_path / "t", **{"vllm_ascend/_version.py": None})
    problem = only(check_contract(tree))
    assert problem.symbol == "__version__" and "0.23.0" in problem.message
    assert check_contract(tree, version="0.23.0") == []


def test_older_version_has_fewer_requirements(tmp_path):
    """A 0.14-style tree: no AscendC flag, Triton registrations only, init gated on Triton."""
    tree = write_tree(
        tmp_path / "old",
        bi="""
        import torch
        from vllm.model_executor.layers.batch_invariant import vllm_is_batch_invariant
        from vllm.triton_utils import HAS_TRITON
        from vllm_ascend.ops.triton.batch_invariant.matmul import (
            addmm_batch_invariant, bmm_batch_invariant, linear_batch_invariant,
            matmul_batch_invariant, mm_batch_invariant)

        def override_envs_for_invariance():
            pass

        _batch_invariant_LIB = None

        def enable_batch_invariant_mode():
            global _batch_invariant_LIB
            _batch_invariant_LIB = torch.library.Library("aten", "IMPL")
            _batch_invariant_LIB.impl("aten::mm", mm_batch_invariant, "NPU")
            _batch_invariant_LIB.impl("aten::addmm", addmm_batch_invariant, "NPU")
            _batch_invariant_LIB.impl("aten::matmul", matmul_batch_invariant, "NPU")
            _batch_invariant_LIB.impl("aten::linear", linear_batch_invariant, "NPU")
            _batch_invariant_LIB.impl("aten::bmm", bmm_batch_invariant, "NPU")

        def init_batch_invariance():
            if vllm_is_batch_invariant():
                if HAS_TRITON:
                    override_envs_for_invariance()
                    enable_batch_invariant_mode()
    """,
    )
    assert check_contract(tree, version="0.14.0rc1") == []
    assert any(
        p.symbol == "HAS_ASCENDC_BATCH_INVARIANT" for p in check_contract(tree, version="0.23.0")
    )


def test_check_installed_finds_without_importing(tmp_path, monkeypatch):
    assert check_installed() is None  # vllm_ascend is not installed here
    tree = write_tree(tmp_path)
    (tree / "vllm_ascend" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    monkeypatch.syspath_prepend(str(tree))
    problems = check_installed()
    assert problems == []
    assert "vllm_ascend" not in sys.modules
