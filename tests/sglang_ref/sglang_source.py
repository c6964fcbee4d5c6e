"""Run pieces of SGLang 0.5.23's own code on CPU, where its modules cannot be imported.

`sglang.srt.models.deepseek_common.deepseek_weight_loader` and `sglang.srt.layers.quantization.kv_cache` import
GPU-only dependencies at module level (deep_gemm -> configs -> torchvision; tvm_ffi), so they fail here. The
logic under test is plain Python, so it is cut out of the installed source file with `ast` and executed as is:
if SGLang changes it, the test runs the changed code (or fails to find it, and says so).
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path


def sglang_file(module: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("sglang is not installed (pip install --no-deps sglang==0.5.23)")
    return Path(next(iter(spec.submodule_search_locations))).parent.joinpath(*module.split(".")).with_suffix(".py")


def function_source(module: str, qualname: str) -> ast.FunctionDef:
    tree = ast.parse(sglang_file(module).read_text())
    cls_name, _, fn_name = qualname.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn_name:
                    return item
    raise LookupError(f"{qualname} not found in {module}")


def kv_scale_remap():
    """SGLang's own KV-scale renaming from `DeepseekV2WeightLoaderMixin.do_load_weights`, as a function
    (name, params_dict) -> the name it loads into (or None where it logs 'not found in params_dict' and skips)."""
    fn = function_source("sglang.srt.models.deepseek_common.deepseek_weight_loader",
                         "DeepseekV2WeightLoaderMixin.do_load_weights")
    block = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and "k_scale" in ast.unparse(n.test)
                  and "params_dict" in ast.unparse(n.test)), None)
    if block is None:
        raise LookupError("do_load_weights no longer has the k_scale/v_scale renaming block")
    body = textwrap.indent(ast.unparse(block), "    ")
    src = (f"def remap(name, params_dict):\n{body}\n"
           "    name = _resolve_quark_fp8_block_scale_name(name, params_dict)\n"
           "    return name if name in params_dict else None\n")
    scope = {"_resolve_quark_fp8_block_scale_name": _resolve_quark}
    exec(compile(src, str(sglang_file("sglang.srt.models.deepseek_common.deepseek_weight_loader")), "exec"), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source
    return scope["remap"]


def _resolve_quark(name, params_dict):
    """SGLang's `_resolve_quark_fp8_block_scale_name`, run from its source (plain string logic)."""
    tree = ast.parse(sglang_file("sglang.srt.models.deepseek_common.deepseek_weight_loader").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_resolve_quark_fp8_block_scale_name")
    scope: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "sglang", "exec"), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source
    return scope[fn.name](name, params_dict)


def kv_cache_process_weights():
    """`BaseKVCacheMethod.process_weights_after_loading` (how loaded k/v scales become the scales used)."""
    fn = function_source("sglang.srt.layers.quantization.kv_cache", "BaseKVCacheMethod.process_weights_after_loading")
    fn.decorator_list = []
    return ast.unparse(fn)


def module_function(module: str, name: str, scope: dict):
    """A module-level function of SGLang's, compiled from its installed source into `scope` (the names it uses
    from its module: the caller supplies them, so a new dependency fails loudly as a NameError)."""
    tree = ast.parse(sglang_file(module).read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise LookupError(f"{name} not found in {module}")
    return _compile(fn, module, scope)


def method(module: str, qualname: str, scope: dict):
    """A class's method as a plain function (self first), compiled from SGLang's installed source into `scope`."""
    return _compile(function_source(module, qualname), module, scope)


def _compile(fn: ast.FunctionDef, module: str, scope: dict):
    fn.decorator_list = []
    fn.returns = None  # annotations may name types the scope does not hold
    for a in [*fn.args.args, *fn.args.kwonlyargs]:
        a.annotation = None
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(sglang_file(module)), "exec"), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source
    return scope[fn.name]


def _class_node(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse(sglang_file(module).read_text())
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise LookupError(f"{name} not found in {module}")
    return node


def kimi_k25_load_weights():
    """(load_weights, hf_to_sglang_mapper) of SGLang's `KimiK25ForConditionalGeneration` (models/kimi_k25.py), run
    from its source: the wrapper's own name handling (its prefix mapper, the vision renames, `language_model.`
    stripped before the DeepSeek loader). `load_weights(self, weights)` takes a stand-in `self`."""
    from collections.abc import Iterable, Mapping
    from dataclasses import dataclass, field
    from typing import Optional

    mapper_cls = _class_node("sglang.srt.models.utils", "WeightsMapper")
    scope: dict = {"dataclass": dataclass, "field": field, "Mapping": Mapping, "Optional": Optional,
                   "Iterable": Iterable, "WeightsMapping": Mapping, "torch": __import__("torch")}
    exec(compile(ast.Module(body=[mapper_cls], type_ignores=[]), "sglang.models.utils", "exec"), scope)  # noqa: S102 -- SGLang's own code
    cls = _class_node("sglang.srt.models.kimi_k25", "KimiK25ForConditionalGeneration")
    assign = next(n for n in cls.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "hf_to_sglang_mapper")
    mapper = eval(compile(ast.Expression(assign.value), "sglang.models.kimi_k25", "eval"), scope)
    fn = function_source("sglang.srt.models.kimi_k25", "KimiK25ForConditionalGeneration.load_weights")
    for arg in fn.args.args:  # Iterable[Tuple[...]]: typing names not in scope
        arg.annotation = None
    fn.returns = None
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "sglang.models.kimi_k25", "exec"), scope)  # noqa: S102 -- SGLang's own code
    return scope["load_weights"], mapper
