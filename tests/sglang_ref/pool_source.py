"""SGLang 0.5.23's KV-pool sizing, cut from its installed source with `ast` and run on given memory figures.

`sglang.srt.mem_cache.kv_cache_configurator` and `sglang.srt.model_executor.pool_configurator` import GPU-only
packages at module level, so they fail on CPU (checked: both raise at import here). The functions below are
SGLang's own code executed as is, with its runtime getters (`get_schedule()`, `get_parallel()`, ...) and the
GPU probe `get_available_gpu_memory` replaced by the figures under test. If SGLang changes the code, the test
runs the changed code; if it renames it, the lookup fails and says what is missing.
"""

from __future__ import annotations

import ast
import gc
import logging
import math
from types import SimpleNamespace

from tests.sglang_ref.sglang_source import function_source, sglang_file

CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator"
POOLS = "sglang.srt.model_executor.pool_configurator"
MEMORY_HOOK = "sglang.srt.arg_groups.memory_hook"


def _module_function(module: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(sglang_file(module).read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{name} not found in {module}")


def _compile(fn: ast.FunctionDef, module: str, scope: dict):
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(sglang_file(module)), "exec"), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source
    return scope[fn.name]


def profile_available_bytes(*, available_gib: float, pre_model_load_gib: float, mem_fraction_static: float,
                            multimodal: bool) -> int:
    """`KVCacheConfigurator._profile_available_bytes` on a GPU that reports `available_gib` free after load
    (SGLang's memory figures are GiB floats: get_available_gpu_memory divides by 1 << 30)."""
    envs = SimpleNamespace(SGLANG_VLM_CACHE_SIZE_MB=SimpleNamespace(get=lambda: 100),
                           SGLANG_MM_FEATURE_CACHE_MB=SimpleNamespace(get=lambda: 1024))
    mm_scope = {"envs": envs, "logger": logging.getLogger("sglang-ref"), "Optional": object}
    mm = _compile(_module_function(CONFIGURATOR, "mm_runtime_reservation_gb"), CONFIGURATOR, mm_scope)
    prefill = SimpleNamespace(full_prefill_max_req=None, backend=None)
    scope = {
        "gc": gc, "math": math, "mm_runtime_reservation_gb": mm,
        "get_available_gpu_memory": lambda *a, **k: available_gib,
        "get_parallel": lambda: SimpleNamespace(launch_world_size=1, world_group=SimpleNamespace(cpu_group=None)),
        "get_schedule": lambda: SimpleNamespace(mem_fraction_static=mem_fraction_static, prefill_max_requests=None,
                                                max_mamba_cache_size=None),
        "get_exec": lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(prefill=prefill))),
        "get_disagg": lambda: SimpleNamespace(disaggregation_mode="null"),
        "get_mm": lambda: SimpleNamespace(mm_feature_transport=None),
        "Backend": SimpleNamespace(FULL="full"),
    }
    fn = _compile(function_source(CONFIGURATOR, "KVCacheConfigurator._profile_available_bytes"), CONFIGURATOR, scope)
    this = SimpleNamespace(device="cuda", gpu_id=0, mambaish_config=None, post_capture_kv_active=False,
                           model_config=SimpleNamespace(is_multimodal=multimodal))
    return fn(this, pre_model_load_gib)


def calculate_pool_tokens(available_bytes: int, cell_size: int, page_size: int = 1) -> int:
    """`DefaultPoolConfigurator.calculate_pool_sizes`: tokens the byte budget holds."""
    scope = {"MemoryPoolConfig": lambda max_total_num_tokens: max_total_num_tokens}
    fn = _compile(function_source(POOLS, "DefaultPoolConfigurator.calculate_pool_sizes"), POOLS, scope)
    this = SimpleNamespace(_fixed_overhead_bytes=0, _cell_size=cell_size, _zero_kv_max_tokens=0)
    return fn(this, available_bytes, page_size)


def mla_cell_size(*, kv_lora_rank: int, qk_rope_head_dim: int, layers: int, kv_bytes: int) -> int:
    """`calculate_mla_kv_cache_dim` (non-DSA model) x layers x element size, as `_compute_cell_size` prices MLA."""
    scope = {"is_deepseek_dsa": lambda hf_config: False}
    fn = _compile(_module_function(CONFIGURATOR, "calculate_mla_kv_cache_dim"), CONFIGURATOR, scope)
    cfg = SimpleNamespace(hf_config=None, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
    return fn(model_config=cfg, kv_cache_dtype=None) * layers * kv_bytes


def eagle_draft_cell(cell_size: int, draft_num_layers: int, num_layers: int) -> int:
    """The non-DSA EAGLE/STANDALONE branch of `DefaultPoolConfigurator.__init__`: the draft's added bytes."""
    init = function_source(POOLS, "DefaultPoolConfigurator.__init__")
    node = next((n for n in ast.walk(init) if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "draft_kv_size" for t in n.targets)
                 and "self._cell_size * draft_num_layers" in ast.unparse(n.value)), None)
    if node is None:
        raise LookupError("DefaultPoolConfigurator.__init__ no longer prices the EAGLE draft as cell * layers ratio")
    env = {"self": SimpleNamespace(_cell_size=cell_size), "draft_num_layers": draft_num_layers,
           "num_layers": num_layers, "int": int}
    return eval(compile(ast.Expression(node.value), str(sglang_file(POOLS)), "eval"), env)


def default_mem_fraction(gpu_mem_mib: float, reserved_mib: float) -> float:
    """memory_hook.py's `mem_fraction_static = round((gpu_mem - reserved_mem) / gpu_mem, 3)`, with its >60 GB floor
    `reserved_mem = max(reserved_mem, 10 * 1024)` applied first: both statements cut from its source."""
    fn = _module_function(MEMORY_HOOK, "handle_gpu_memory_settings")
    floor = next(n for n in ast.walk(fn) if isinstance(n, ast.If) and "60 * 1024" in ast.unparse(n.test))
    frac = next(n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "mem_fraction_static"
                and "gpu_mem - reserved_mem" in ast.unparse(n.value))
    env = {"gpu_mem": gpu_mem_mib, "reserved_mem": reserved_mib, "round": round, "max": max}
    exec(compile(ast.Module(body=[floor, frac], type_ignores=[]), str(sglang_file(MEMORY_HOOK)), "exec"), env)  # noqa: S102 -- SGLang's own code
    return env["mem_fraction_static"]

