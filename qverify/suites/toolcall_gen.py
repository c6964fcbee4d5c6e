"""Synthetic coding-agent tool-call items: a pool of tools, requests whose arguments
appear literally in the prompt, distractor tools, irrelevance and parallel calls."""

from __future__ import annotations

import random
from collections.abc import Callable

NO_TOOL_ANSWER = "None of the available tools can do that."

MODS = ["core", "utils", "api", "db", "cli", "net", "auth", "cache", "jobs", "models", "views", "io"]
FILES = ["main", "config", "server", "client", "parser", "worker", "router", "schema", "helpers", "loader",
         "queue", "store", "session", "handler", "metrics", "events"]
BRANCHES = ["main", "dev", "release", "hotfix", "feature-login", "fix-cache", "refactor-io", "bump-deps"]
SYMBOLS = ["load_config", "parse_args", "run_server", "fetch_user", "save_state", "open_db", "close_conn",
           "retry_call", "build_index", "render_page", "send_mail", "hash_key", "split_batch", "merge_rows"]
PACKAGES = ["requests", "numpy", "pandas", "flask", "pytest", "rich", "httpx", "pydantic", "click", "scipy"]
SERVICES = ["api", "worker", "scheduler", "gateway", "db", "cache"]
WORDS = ["fix", "add", "update", "remove", "refactor", "bump", "clean", "rename", "speed", "guard"]
THINGS = ["retry logic", "login flow", "cache keys", "config loader", "test fixtures", "error messages",
          "logging", "parser edge cases", "db pool", "timeouts"]
COMMANDS = ["make build", "npm test", "ls -la", "python setup.py sdist", "make lint", "cargo check", "go vet"]
PATTERNS = ["TODO", "FIXME", "import os", "def main", "raise ValueError", "async def", "print(", "self.cache"]


def _path(rng: random.Random) -> str:
    return f"src/{rng.choice(MODS)}/{rng.choice(FILES)}.py"


def _test_path(rng: random.Random) -> str:
    return f"tests/{rng.choice(MODS)}/test_{rng.choice(FILES)}.py"


def _tool(name: str, desc: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S, I, B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}

# name -> (schema, [request templates: (text, arg builder)])
Templates = list[tuple[str, Callable[[random.Random], dict]]]
TOOLS: dict[str, tuple[dict, Templates]] = {}


def tool(name: str, desc: str, props: dict, required: list[str], templates: Templates) -> None:
    TOOLS[name] = (_tool(name, desc, props, required), templates)


tool("read_file", "Read a file", {"path": S, "start_line": I}, ["path"], [
    ("Read the file {path}.", lambda r: {"path": _path(r)}),
    ("Show me {path} from line {start_line}.", lambda r: {"path": _path(r), "start_line": r.randint(2, 400)}),
    ("Open {path} so I can see it.", lambda r: {"path": _path(r)}),
])
tool("write_file", "Write text to a file", {"path": S, "content": S}, ["path", "content"], [
    ("Write '{content}' to {path}.", lambda r: {"path": _path(r), "content": f"# {r.choice(WORDS)} {r.choice(THINGS)}"}),
])
tool("list_dir", "List a directory", {"path": S}, ["path"], [
    ("List the files in src/{mod}.", lambda r: {"path": f"src/{r.choice(MODS)}"}),
    ("What is inside the folder src/{mod}?", lambda r: {"path": f"src/{r.choice(MODS)}"}),
])
tool("grep", "Search files for a pattern", {"pattern": S, "path": S}, ["pattern", "path"], [
    ("Search for '{pattern}' in src/{mod}.", lambda r: {"pattern": r.choice(PATTERNS), "path": f"src/{r.choice(MODS)}"}),
    ("Find every '{pattern}' under src/{mod}.", lambda r: {"pattern": r.choice(PATTERNS), "path": f"src/{r.choice(MODS)}"}),
])
tool("run_tests", "Run a test file", {"path": S, "verbose": B}, ["path"], [
    ("Run the tests in {path}.", lambda r: {"path": _test_path(r)}),
    ("Run {path} with verbose output.", lambda r: {"path": _test_path(r), "verbose": True}),
])
tool("git_diff", "Show the diff against a branch", {"ref": S}, ["ref"], [
    ("Show the diff against {ref}.", lambda r: {"ref": r.choice(BRANCHES)}),
    ("What changed compared to {ref}?", lambda r: {"ref": r.choice(BRANCHES)}),
])
tool("git_log", "Show recent commits", {"count": I}, ["count"], [
    ("Show the last {count} commits.", lambda r: {"count": r.randint(2, 30)}),
])
tool("git_commit", "Commit staged changes", {"message": S}, ["message"], [
    ("Commit with the message '{message}'.", lambda r: {"message": f"{r.choice(WORDS)} {r.choice(THINGS)}"}),
])
tool("checkout", "Switch to a branch", {"branch": S}, ["branch"], [
    ("Switch to the branch {branch}.", lambda r: {"branch": r.choice(BRANCHES)}),
    ("Check out {branch}.", lambda r: {"branch": r.choice(BRANCHES)}),
])
tool("create_branch", "Create a new branch", {"name": S}, ["name"], [
    ("Create a branch called {name}.", lambda r: {"name": f"{r.choice(WORDS)}-{r.choice(FILES)}"}),
])
tool("run_command", "Run a shell command", {"command": S}, ["command"], [
    ("Run the command '{command}'.", lambda r: {"command": r.choice(COMMANDS)}),
])
tool("find_symbol", "Find where a symbol is defined", {"name": S}, ["name"], [
    ("Where is {name} defined?", lambda r: {"name": r.choice(SYMBOLS)}),
    ("Find the definition of {name}.", lambda r: {"name": r.choice(SYMBOLS)}),
])
tool("rename_symbol", "Rename a symbol in a file", {"old": S, "new": S, "path": S}, ["old", "new", "path"], [
    ("Rename {old} to {new} in {path}.", lambda r: {"old": r.choice(SYMBOLS), "new": r.choice(SYMBOLS), "path": _path(r)}),
])
tool("delete_file", "Delete a file", {"path": S}, ["path"], [
    ("Delete the file {path}.", lambda r: {"path": _path(r)}),
    ("Remove {path} from the repo.", lambda r: {"path": _path(r)}),
])
tool("move_file", "Move or rename a file", {"src": S, "dst": S}, ["src", "dst"], [
    ("Move {src} to {dst}.", lambda r: {"src": _path(r), "dst": _path(r)}),
])
tool("install_package", "Install a Python package", {"name": S, "version": S}, ["name"], [
    ("Install the package {name}.", lambda r: {"name": r.choice(PACKAGES)}),
    ("Install {name} version {version}.", lambda r: {"name": r.choice(PACKAGES), "version": f"{r.randint(1, 4)}.{r.randint(0, 9)}"}),
])
tool("format_code", "Format a source file", {"path": S}, ["path"], [
    ("Format the code in {path}.", lambda r: {"path": _path(r)}),
])
tool("lint", "Lint a source file", {"path": S}, ["path"], [
    ("Lint {path}.", lambda r: {"path": _path(r)}),
    ("Check {path} for lint errors.", lambda r: {"path": _path(r)}),
])
tool("view_logs", "Show the last lines of a service log", {"service": S, "lines": I}, ["service", "lines"], [
    ("Show the last {lines} lines of the {service} log.", lambda r: {"service": r.choice(SERVICES), "lines": r.randint(10, 200)}),
])
tool("restart_service", "Restart a service", {"service": S}, ["service"], [
    ("Restart the {service} service.", lambda r: {"service": r.choice(SERVICES)}),
])
tool("count_lines", "Count the lines of a file", {"path": S}, ["path"], [
    ("How many lines does {path} have?", lambda r: {"path": _path(r)}),
])
tool("make_dir", "Create a directory", {"path": S}, ["path"], [
    ("Create the folder src/{mod}/{file}.", lambda r: {"path": f"src/{r.choice(MODS)}/{r.choice(FILES)}"}),
])
tool("set_env", "Set an environment variable", {"name": S, "value": S}, ["name", "value"], [
    ("Set {name} to {value}.", lambda r: {"name": r.choice(["DEBUG", "LOG_LEVEL", "PORT", "WORKERS", "MODE"]), "value": r.choice(["on", "off", "info", "fast", "safe"])}),
])
tool("kill_process", "Kill a process by id", {"pid": I}, ["pid"], [
    ("Kill the process {pid}.", lambda r: {"pid": r.randint(100, 9999)}),
])

# Tools that are easy to confuse: offered together as distractors.
CONFUSABLE = {
    "read_file": ["write_file", "count_lines", "delete_file"], "write_file": ["read_file", "move_file"],
    "run_tests": ["run_command", "lint"], "git_diff": ["git_log", "git_commit"], "git_log": ["git_diff"],
    "checkout": ["create_branch"], "create_branch": ["checkout"], "find_symbol": ["rename_symbol", "grep"],
    "grep": ["find_symbol", "list_dir"], "lint": ["format_code"], "format_code": ["lint"],
    "delete_file": ["move_file"], "view_logs": ["restart_service"], "restart_service": ["view_logs", "kill_process"],
}


def fill(template: str, args: dict, rng: random.Random) -> str:
    extra = {"mod": args.get("path", "src/x").split("/")[1] if "{mod}" in template else "",
             "file": args.get("path", "a/b/c").split("/")[-1] if "{file}" in template else ""}
    return template.format(**{**extra, **args})


def make_call(rng: random.Random, name: str) -> tuple[str, dict]:
    template, build = rng.choice(TOOLS[name][1])
    args = build(rng)
    # templates that read mod/file out of the path re-derive the text from the path we built
    text = template
    if "{mod}" in template or "{file}" in template:
        parts = args["path"].split("/")
        text = template.replace("{mod}", parts[1]).replace("{file}", parts[2] if len(parts) > 2 else "")
    return text.format(**args), args
