"""Haystacks of coding-agent context (source, logs, tool output) with KEY = value needles.

Filler carries no digits, so the needle's digits are the only ones in the context:
an earlier probe lost its place in values when the filler was full of digits.
"""

from __future__ import annotations

import random

WORDS_A = ["RETRY", "CACHE", "BATCH", "POOL", "QUEUE", "SHARD", "TOKEN", "BUFFER", "WORKER", "SOCKET",
           "INDEX", "STREAM", "LEASE", "QUOTA", "BACKOFF", "REPLICA", "CHUNK", "THREAD", "FLUSH", "SPILL"]
WORDS_B = ["LIMIT", "SIZE", "TIMEOUT", "PORT", "COUNT", "DEPTH", "WINDOW", "BUDGET", "FACTOR", "SEED",
           "PERIOD", "OFFSET", "RATIO", "CAP", "LEVEL", "DELAY"]
IDENTS = ["config", "handler", "request", "session", "payload", "result", "worker", "client", "router", "record",
          "buffer", "context", "cursor", "state", "entry", "event", "stream", "job", "task", "item"]
VERBS = ["load", "parse", "fetch", "store", "flush", "check", "build", "merge", "split", "send", "read", "write"]
LOG_MSGS = ["connection accepted", "cache miss for key", "retrying request", "worker started", "flushing buffer",
            "request finished", "health check ok", "lease renewed", "shard rebalanced", "token refreshed",
            "slow query detected", "queue drained", "config reloaded", "session expired"]
LEVELS = ["INFO", "WARN", "DEBUG", "ERROR"]


def key_name(rng: random.Random) -> str:
    return f"{rng.choice(WORDS_A)}_{rng.choice(WORDS_B)}"


def value(rng: random.Random) -> str:
    return str(rng.randint(1000, 9999))


def filler_block(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:  # source
        v, a, b = rng.choice(VERBS), rng.choice(IDENTS), rng.choice(IDENTS)
        return (f"def {v}_{a}({b}):\n    {a} = {rng.choice(VERBS)}({b})\n"
                f"    if not {a}:\n        return None\n    return {a}.{rng.choice(VERBS)}()")
    if kind == 1:  # logs
        return "\n".join(f"{rng.choice(LEVELS)} {rng.choice(IDENTS)}: {rng.choice(LOG_MSGS)}" for _ in range(3))
    # tool output
    files = " ".join(f"{rng.choice(IDENTS)}_{rng.choice(VERBS)}.py" for _ in range(4))
    return f"$ ls src/{rng.choice(IDENTS)}\n{files}"


def haystack(rng: random.Random, needles: list[str], target_tokens: int, count_tokens, depth_sweep: list[float]) -> str:
    """Filler blocks up to target_tokens, with needle i inserted at relative depth depth_sweep[i]."""
    blocks: list[str] = []
    # grow in steps so token counting stays cheap
    while True:
        batch = [filler_block(rng) for _ in range(8)]
        trial = "\n\n".join(blocks + batch + needles)
        if count_tokens(trial) > target_tokens:
            # add one at a time up to the limit
            for b in batch:
                if count_tokens("\n\n".join(blocks + [b] + needles)) > target_tokens:
                    break
                blocks.append(b)
            break
        blocks += batch
    for needle, depth in sorted(zip(needles, depth_sweep), key=lambda x: -x[1]):
        blocks.insert(round(depth * len(blocks)), needle)
    return "\n\n".join(blocks)
