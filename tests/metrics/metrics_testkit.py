"""Helpers for the metrics tests: scraping and reading /metrics, driving load, and the
PromQL expressions written in the monitoring assets (`monitoring/`).

The asset readers (`dashboard_queries`, `alert_queries`, `adapter_queries`) are the single
place that knows where each asset keeps its PromQL; the Helm chart's tests can reuse them.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sluice.runtime import constants as C

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
DASHBOARD = MONITORING / "grafana" / "sluice-dashboard.json"
ALERTS = MONITORING / "prometheus" / "alerts.yaml"
ALERTS_TEST = MONITORING / "prometheus" / "alerts.test.yaml"
ADAPTER_RULES = MONITORING / "prometheus-adapter" / "rules.yaml"
SATURATION = MONITORING / "prometheus" / "saturation.yaml"

# the live runtime the tests start (conftest.py)
MODEL = "tiny-llama"  # the served name: the model folder's name
KV_POOL_TOKENS = 1024
REQUEST_SLOTS = 4


# every documented metric, from the constants module, with its Prometheus type
DOCUMENTED: dict[str, str] = {
    C.METRIC_QUEUE_REQUESTS: "gauge",
    C.METRIC_RUNNING_REQUESTS: "gauge",
    C.METRIC_KV_TOKEN_USAGE: "gauge",
    C.METRIC_NEW_TOKEN_RATIO: "gauge",
    C.METRIC_RETRACTIONS_TOTAL: "counter",
    C.METRIC_RETRACTED_TOKENS_TOTAL: "counter",
    C.METRIC_PREFIX_CACHE_HIT_RATIO: "gauge",
    C.METRIC_GENERATION_THROUGHPUT: "gauge",
    C.METRIC_MAX_TOTAL_TOKENS: "gauge",
    C.METRIC_REQUESTS_TOTAL: "counter",
    C.METRIC_PROMPT_TOKENS_TOTAL: "counter",
    C.METRIC_GENERATION_TOKENS_TOTAL: "counter",
    C.METRIC_CACHED_TOKENS_TOTAL: "counter",
    C.METRIC_TTFT_SECONDS: "histogram",
    C.METRIC_ITL_SECONDS: "histogram",
    C.METRIC_E2E_SECONDS: "histogram",
    C.METRIC_QUEUE_TIME_SECONDS: "histogram",
    C.METRIC_COMPUTED_PROMPT_TOKENS_TOTAL: "counter",
    C.METRIC_QUEUE_PROMPT_TOKENS: "gauge",
    C.METRIC_DISAGG_SENT_TOKENS_TOTAL: "counter",
    C.METRIC_DISAGG_RECEIVED_TOKENS_TOTAL: "counter",
    C.METRIC_DISAGG_FAILED_TRANSFERS_TOTAL: "counter",
    C.METRIC_DISAGG_WAITING_REQUESTS: "gauge",
    C.METRIC_DISAGG_TRANSFER_SECONDS: "histogram",
}
CONSTANT_METRICS = {
    v for k, v in vars(C).items() if k.startswith("METRIC_") and k != "METRIC_PREFIX"
}


def family_name(metric: str) -> str:
    """The family name prometheus-client's parser gives a documented metric."""
    return metric.removesuffix("_total") if DOCUMENTED[metric] == "counter" else metric


# --- reading /metrics ------------------------------------------------------------------------
@dataclass
class Scrape:
    at: float
    families: dict[str, Any]  # family name -> prometheus_client Metric

    @classmethod
    def parse(cls, text: str, at: float | None = None) -> Scrape:
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        return cls(time.monotonic() if at is None else at, fams)

    def samples(self) -> Iterable[Any]:
        for fam in self.families.values():
            yield from fam.samples

    def value(self, sample: str, **labels: str) -> float:
        """The one sample named `sample` whose labels include `labels`."""
        found = [
            s.value
            for s in self.samples()
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if len(found) != 1:
            raise KeyError(f"{len(found)} samples {sample}{labels}")
        return found[0]

    def total(self, sample: str) -> float:
        return sum(s.value for s in self.samples() if s.name == sample)

    def counter_samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample that must never decrease: counters and histogram buckets, counts, sums."""
        out = {}
        for fam in self.families.values():
            if fam.type in ("counter", "histogram"):
                for s in fam.samples:
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


_SCRAPER = httpx.Client(timeout=10)  # kept alive: a new client costs ~50 ms, a scrape ~5 ms


def scrape(url: str) -> Scrape:
    r = _SCRAPER.get(url + C.METRICS_PATH)
    r.raise_for_status()
    return Scrape.parse(r.text)


def eventually(check: Callable[[], Any], timeout: float = 10.0, every: float = 0.1) -> Any:
    """`check()`'s first truthy result; its last AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"still {result!r} after {timeout}s")
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(every)


# --- load --------------------------------------------------------------------------------------
def generate(url: str, input_ids: list[int], **sampling: Any) -> dict[str, Any]:
    """One /generate request (greedy unless told), its JSON response."""
    body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, **sampling}}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    r.raise_for_status()
    return r.json()


@dataclass
class LoadRun:
    responses: list[dict[str, Any]]
    scrapes: list[Scrape] = field(default_factory=list)

    def series(self, metric: str) -> list[float]:
        return [s.total(metric) for s in self.scrapes]

    def timeline(self, *metrics: str) -> str:
        """One line per scrape: seconds since the first, then each metric (for messages)."""
        t0 = self.scrapes[0].at
        rows = [
            f"{s.at - t0:6.2f}s " + " ".join(f"{m}={s.total(m):g}" for m in metrics)
            for s in self.scrapes
        ]
        return "\n".join(rows)


def run_load(
    url: str, requests: list[dict[str, Any]], poll_s: float = 0.02, record: list | None = None
) -> LoadRun:
    """Send `requests` (kwargs of `generate`) all at once and scrape /metrics every
    `poll_s` until all have answered; `record` (if given) gets every scrape too."""
    return asyncio.run(_run_load(url, requests, poll_s, record))


async def _run_load(
    url: str, requests: list[dict[str, Any]], poll_s: float, record: list | None
) -> LoadRun:
    scrapes: list[Scrape] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(input_ids: list[int], **sampling: Any) -> dict[str, Any]:
            body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, **sampling}}
            r = await client.post(url + "/generate", json=body)
            r.raise_for_status()
            return r.json()

        async def poll() -> None:
            r = await client.get(url + C.METRICS_PATH)
            scrapes.append(Scrape.parse(r.text))

        await poll()
        tasks = [asyncio.ensure_future(one(**r)) for r in requests]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(poll_s)
            await poll()
        responses = [t.result() for t in tasks]
        await poll()
    if record is not None:
        record.extend(scrapes)
    return LoadRun(responses, scrapes)


def load_held_at(
    runtime: Any,
    requests: list[dict[str, Any]],
    output_tokens: int,
    running: int,
    record: list | None = None,
) -> tuple[Scrape, LoadRun]:
    """Send `requests` at once (as `run_load`), freeze the scheduler once `running` of them
    have `output_tokens` tokens each, scrape /metrics while it is frozen, let it go on, and
    return that scrape and the finished run. The scheduler is paused until all the requests
    are queued, so they are scheduled together however the sends are spread in time."""
    outcome: list[LoadRun] = []
    runtime.hold.pause()
    runtime.hold.arm(output_tokens, running)
    sender = threading.Thread(
        target=lambda: outcome.append(run_load(runtime.url, requests, record=record))
    )
    sender.start()
    try:
        eventually(lambda: scrape(runtime.url).value(C.METRIC_QUEUE_REQUESTS) == len(requests), 60)
        runtime.hold.resume()
        published = runtime.hold.wait_held()
        # the frozen state's stats reach the API process through the detokenizer: wait for them
        held = eventually(lambda: _showing(scrape(runtime.url), published), timeout=30)
    finally:
        runtime.hold.disarm()
        sender.join(120)
    (run,) = outcome
    return held, run


def _showing(s: Scrape, stats: dict[str, Any]) -> Scrape | None:
    """`s` if it shows these scheduler stats (the gauges a test looks at), else None."""
    shown = (
        s.value(C.METRIC_QUEUE_REQUESTS),
        s.value(C.METRIC_RUNNING_REQUESTS),
        s.value(C.METRIC_KV_TOKEN_USAGE),
    )
    want = (stats["queue_requests"], stats["running_requests"], stats["kv_token_usage"])
    return s if shown == want else None


class BackgroundLoad:
    """Keeps `concurrency` requests in flight until stopped (for Prometheus to scrape)."""

    def __init__(self, url: str, make_request: Callable[[int], dict[str, Any]], concurrency: int):
        self.url = url
        self.make_request = make_request
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(concurrency)]

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                generate(self.url, **self.make_request(worker * 1000 + n))
                self.done += 1
            except Exception as exc:  # reported by the test
                self.errors.append(exc)
                return
            n += 1

    def __enter__(self) -> BackgroundLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)


# --- PromQL in the monitoring assets ------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    source: str  # where it is written, for messages
    expr: str  # as written in the asset, placeholders included
    kind: str  # "dashboard" | "alert" | "adapter" | "adapter-external" | "variable" | "recording" | "recorded"
    metric: str = ""  # adapter rules: the series <<.Series>> stands for


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict[str, Any]]:
    panels = []
    for p in dashboard()["panels"]:
        panels.append(p)
        panels.extend(p.get("panels", []))  # collapsed rows keep theirs inside
    return panels


def dashboard_queries() -> list[Query]:
    return [
        Query(f"dashboard panel {p['title']!r} target {t['refId']}", t["expr"], "dashboard")
        for p in dashboard_panels()
        for t in p.get("targets", [])
    ]


def dashboard_variable_queries() -> list[Query]:
    """The template variables' `label_values(<selector>, label)` selectors."""
    out = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
        assert m, f"variable {v['name']}: not a label_values() query: {q}"
        out.append(Query(f"dashboard variable {v['name']}", m.group(1), "variable"))
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_queries() -> list[Query]:
    return [Query(f"alert {r['alert']}", r["expr"], "alert") for r in alert_rules()]


def adapter_rules() -> list[dict[str, Any]]:
    return yaml.safe_load(ADAPTER_RULES.read_text())["rules"]


def adapter_external_rules() -> list[dict[str, Any]]:
    return yaml.safe_load(ADAPTER_RULES.read_text())["externalRules"]


def adapter_queries() -> list[Query]:
    out = []
    for kind, rules in (("adapter", adapter_rules()), ("adapter-external", adapter_external_rules())):
        for rule in rules:
            metric = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
            out.append(Query(f"{kind} seriesQuery {metric}", rule["seriesQuery"], kind, metric))
            out.append(Query(f"{kind} metricsQuery {metric}", rule["metricsQuery"], kind, metric))
    return out


def saturation_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(SATURATION.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recording_queries() -> list[Query]:
    return [Query(f"recording rule {r['record']}", r["expr"], "recording") for r in saturation_rules()]


def all_queries() -> list[Query]:
    return (
        dashboard_queries() + dashboard_variable_queries() + alert_queries() + adapter_queries()
        + recording_queries()
    )


def substitute(q: Query, namespace: str, model: str, pod: str, rate_interval: str) -> str:
    """The expression as Grafana or prometheus-adapter would send it for one pod (external
    metrics: for the pod's InferenceService, as the operator's HPA selects it). Recording
    rules are sent as written."""
    expr = q.expr
    if q.kind == "recording":
        return expr
    for name, value in (
        ("__rate_interval", rate_interval),
        ("namespace", namespace),
        ("model", model),
    ):
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    expr = expr.replace("<<.Series>>", q.metric)
    if q.kind == "adapter-external":
        service = pod.rsplit("-", 2)[0]  # <deployment>-<pod-template-hash>-<suffix>
        expr = expr.replace("<<.LabelMatchers>>", f'namespace="{namespace}",{C.SATURATION_SERVICE_LABEL}="{service}"')
    expr = expr.replace("<<.LabelMatchers>>", f'namespace="{namespace}",pod="{pod}"')
    expr = expr.replace("<<.GroupBy>>", "pod")
    assert "$" not in expr.replace("$labels", "") and "<<" not in expr, expr
    return expr


METRIC_RE = re.compile(r"\b((?:sluice|kube)_[a-z0-9_]+)\b")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (histogram suffixes stripped)."""
    names = set()
    for name in METRIC_RE.findall(expr):
        for suffix in ("_bucket", "_count", "_sum"):
            if name.startswith(C.METRIC_PREFIX) and name.endswith(suffix):
                name = name.removesuffix(suffix)
        names.add(name)
    return names
