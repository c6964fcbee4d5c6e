"""lmeval:<task>: any lm-evaluation-harness task against the served endpoint, gated like any suite.

lm-eval owns prompts, requests and scoring here, so this suite does not use the generic
per-item request path: it sets `runs_itself`, and the runner (qverify.evals.runner) calls
`run(endpoint, replicate, seed, limit)` once per replicate. That runs `lm_eval.simple_evaluate`
(`local-chat-completions` or `local-completions`, `log_samples=True`) and turns each logged
sample into an ItemResult whose `scores` are lm-eval's per-sample metric values, so the gate
pairs and tests them item by item. Its runs are filed as runs/<build>/lmeval:<task>; options
(include_path for a custom task folder, api, num_fewshot, ...) come from qverify.toml's
`[suite_options."lmeval:<task>"]`, and its items from `--source lm-eval`.

Item ids are stable: a hash of (task name, lm-eval's doc_hash), so they pair across
builds and replicates; fewshot sampling keeps lm-eval's fixed default seed for the same
reason, and only the request `seed` changes with `seed`.

Known limits (why the core suites do not run through lm-eval):
  - one HTTP error (e.g. a 400 on one prompt) aborts the whole run -> InfraError;
  - per-sample `tools` are not supported;
  - under concurrency lm-eval batches gen_kwargs across requests;
  - loglikelihood / multiple-choice tasks need `api="completions"` with `tokenizer=`
    (a local tokenizer path) and a server that returns echo logprobs;
  - `dataset_path: json` tasks resolve relative `data_files` against the working directory.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from qverify.errors import BadInput, InfraError
from qverify.models import Endpoint, Item, ItemResult, Response, Score, content_hash
from qverify.registry import unknown_message
from qverify.suites.base import Split, Suite, suites

ADAPTER_VERSION = "1"


def item_id(task: str, doc_hash: str) -> str:
    return f"lmeval-{content_hash([task, doc_hash], 12)}"


def _with_unique_ids(rows: list[tuple[str, int, str]]) -> dict[tuple[str, int], str]:
    """(task, doc_id, doc_hash) rows -> ids; identical docs get their doc_id appended."""
    out, seen = {}, set()
    for task, doc_id, doc_hash in sorted(rows):
        iid = item_id(task, doc_hash)
        if iid in seen:
            iid = f"{iid}-{doc_id}"
        seen.add(iid)
        out[(task, doc_id)] = iid
    return out


def _endpoint_url(base_url: str, api: str) -> str:
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/chat/completions" if api == "chat" else f"{base}/completions"


def _number(v: Any) -> float | None:
    try:
        return float(v) if not isinstance(v, (str, bytes, list, tuple, dict)) else None
    except (TypeError, ValueError):
        return None


@suites.register("lmeval")
class LmEvalSuite(Suite):
    name = "lmeval"
    version = ADAPTER_VERSION
    description = "Any lm-evaluation-harness task against the endpoint (lm_eval.simple_evaluate, per-sample results)."
    primary_metric = "acc"
    sources = ("lm-eval",)
    default_n = 0  # all of the task's documents unless `limit` is given
    runs_itself: ClassVar[bool] = True

    def __init__(
        self,
        task: str = "",
        count_tokens=None,
        *,
        api: Literal["chat", "completions"] = "chat",
        include_path: str | None = None,
        tokenizer: str | None = None,
        tokenized_requests: bool | None = None,
        num_fewshot: int | None = None,
        gen_kwargs: dict[str, Any] | None = None,
        metric: str | None = None,
        num_concurrent: int = 1,
        max_retries: int = 3,
        timeout_s: int = 300,
        **options: Any,
    ):
        super().__init__(count_tokens, **options)
        if not task:
            raise BadInput("lmeval needs a task name", fix="use lmeval:<task>, e.g. lmeval:gsm8k")
        if api not in ("chat", "completions"):
            raise BadInput(f"unknown lm-eval api {api!r}", fix="use api='chat' or api='completions'")
        self.task, self.api, self.include_path, self.tokenizer = task, api, include_path, tokenizer
        self.tokenized_requests = bool(tokenizer) if tokenized_requests is None else tokenized_requests
        self.num_fewshot, self.gen_kwargs = num_fewshot, gen_kwargs
        self.num_concurrent, self.max_retries, self.timeout_s = num_concurrent, max_retries, timeout_s
        self.version = f"{ADAPTER_VERSION}:{task}"  # the task's own version goes into each result's metadata
        self.name = f"lmeval:{task}"  # one run per task: the plan, the store and the results all key by it
        self._metric_chosen = bool(metric)
        if metric:
            self.primary_metric = metric
        self._tm = None

    @property
    def suite_name(self) -> str:
        return self.name

    # -- lm-eval plumbing ------------------------------------------------------------
    def _task_manager(self):
        if self._tm is None:
            try:  # an extra: the core install runs without it
                from lm_eval.tasks import TaskManager
            except ImportError as e:
                raise InfraError("the lmeval:<task> suites need the lm-eval package",
                                 fix="pip install 'qverify[lmeval]' (scripts/setup.sh installs it)") from e

            # indexing lm-eval's ~10k built-in configs takes 15-20 s; skip it for custom task folders
            self._tm = TaskManager(include_path=self.include_path, include_defaults=self.include_path is None)
            if self.task not in self._tm.all_tasks:
                raise BadInput(
                    unknown_message("lm-eval task", self.task, self._tm.all_tasks),
                    fix="check `lm-eval ls tasks`, or pass include_path= for a custom YAML task folder",
                )
        return self._tm

    def _model_args(self, endpoint: Endpoint, seed: int) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model": endpoint.model,
            "base_url": _endpoint_url(endpoint.base_url, self.api),
            "seed": seed,
            "num_concurrent": self.num_concurrent,
            "max_retries": self.max_retries,
            "timeout": self.timeout_s,
            "tokenizer_backend": "huggingface" if self.tokenizer else "none",
            "tokenized_requests": self.tokenized_requests,
        }
        if self.tokenizer:
            args["tokenizer"] = self.tokenizer
        if endpoint.api_key and endpoint.api_key != "EMPTY":
            args["header"] = {"Authorization": f"Bearer {endpoint.api_key}"}
        return args

    # -- the run -------------------------------------------------------------------
    def run(self, endpoint: Endpoint, replicate: int = 0, seed: int = 0, limit: int | None = None) -> list[ItemResult]:
        """Run the task once against `endpoint`; one ItemResult per document, ordered by id.

        `seed` goes into each request (so replicates at temperature > 0 differ);
        `limit` takes the task's first `limit` documents. Raises InfraError when lm-eval
        aborts (it stops at the first failed request).
        """
        import lm_eval

        tm = self._task_manager()
        try:
            res = lm_eval.simple_evaluate(
                model="local-chat-completions" if self.api == "chat" else "local-completions",
                model_args=self._model_args(endpoint, seed),
                tasks=[self.task],
                task_manager=tm,
                num_fewshot=self.num_fewshot,
                limit=limit,
                log_samples=True,
                apply_chat_template=self.api == "chat",
                gen_kwargs=self.gen_kwargs,
                bootstrap_iters=0,
            )
        except Exception as e:  # lm-eval raises whatever its HTTP client or task code raised
            raise InfraError(
                f"lm-eval run of {self.task} against {endpoint.base_url} failed: {type(e).__name__}: {str(e)[:200]}",
                fix="check the server log; one failed request aborts a whole lm-eval run",
            ) from e
        if not res or not res.get("samples"):
            raise InfraError(f"lm-eval returned no samples for {self.task}", fix="check that the task has documents")
        return self._to_results(res, replicate, seed)

    def _to_results(self, res: dict[str, Any], replicate: int, seed: int) -> list[ItemResult]:
        grouped: dict[tuple[str, int], list[dict]] = {}
        for task, samples in res["samples"].items():
            for s in samples:  # one entry per (doc, filter): merge the filters' metrics per doc
                grouped.setdefault((task, s["doc_id"]), []).append(s)
        ids = _with_unique_ids([(t, d, ss[0]["doc_hash"]) for (t, d), ss in grouped.items()])
        out = []
        for (task, doc_id), ss in grouped.items():
            scores: dict[str, float] = {}
            for s in ss:
                for m in s["metrics"]:
                    v = _number(s.get(m))
                    if v is not None:
                        scores[m if s["filter"] == "none" else f"{m}/{s['filter']}"] = v
            first = ss[0]
            raw = first["resps"][0][0] if first["resps"] and first["resps"][0] else None
            text = raw if isinstance(raw, str) else None
            if not self._metric_chosen and scores:
                self.primary_metric = next(iter(scores))  # the task's first metric, unless `metric=` chose one
                self._metric_chosen = True
            primary = scores.get(self.primary_metric)
            reason = None
            if primary is not None and primary == 0:
                reason = f"{self.primary_metric}=0: got {(text or str(first['filtered_resps']))[:80]!r}, want {str(first['target'])[:80]!r}"
            out.append(
                ItemResult(
                    item_id=ids[(task, doc_id)],
                    suite=self.suite_name,
                    replicate=replicate,
                    seed=seed,
                    request_hash=first["prompt_hash"][:16],
                    response=Response(content=text, finish_reason="stop" if text is not None else None),
                    scores=scores,
                    reason=reason,
                    metadata={
                        "lm_eval_task": task,
                        "doc_id": doc_id,
                        "target": str(first["target"])[:200],
                        "task_version": res.get("versions", {}).get(task),
                        "filtered_resps": json.loads(json.dumps([s["filtered_resps"] for s in ss], default=str))[:4],
                    },
                )
            )
        return sorted(out, key=lambda r: r.item_id)

    # -- the Suite interface -------------------------------------------------------------
    def items(
        self, split: Split = "test", n: int | None = None, seed: int = 0, source: str = "lm-eval"
    ) -> list[Item]:
        """The task's evaluation documents as Items with the ids `run` gives them. lm-eval
        tasks feed no training, so the train split is empty."""
        if split == "train":
            return []
        from lm_eval.utils import handle_non_serializable, hash_string

        rows, docs = [], {}
        for name, task in sorted(self._task_manager().load([self.task])["tasks"].items()):
            for doc_id, doc in enumerate(list(task.eval_docs)[:n] if n else task.eval_docs):
                doc_hash = hash_string(json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False))
                rows.append((name, doc_id, doc_hash))
                docs[(name, doc_id)] = (task, doc)
        ids = _with_unique_ids(rows)
        out = []
        for key, iid in ids.items():
            task, doc = docs[key]
            prompt = task.doc_to_text(doc)
            out.append(
                Item(
                    id=iid,
                    suite=self.suite_name,
                    kind="completion",
                    prompt=str(prompt),
                    target={"target": str(task.doc_to_target(doc))},
                    metadata={"lm_eval_task": key[0], "doc_id": key[1]},
                )
            )
        return out

    def item_counts(self) -> dict[str, str]:
        return {"lm-eval": f"the documents of lm-eval task {self.task}"}

    def score(self, item: Item, response: Response) -> Score:
        # lm-eval scores its own samples inside run(); a per-item score here would be an empty, silent pass
        raise NotImplementedError("lmeval items are scored by lm-eval inside LmEvalSuite.run (runs_itself)")
