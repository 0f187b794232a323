"""Every tunable of `sluice router`, in one place (like `ServerArgs` for `sluice serve`).

No heavy imports: the operator may read the flag names and defaults from here.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from urllib.parse import urlsplit

from sluice.runtime.constants import (
    CONTAINER_PORT_NAME,
    DEFAULT_HOST,
    DISAGG_BOOTSTRAP_PORT_NAME,
    DISAGG_DEFAULT_BOOTSTRAP_PORT,
    FLAG_DISCOVER_DECODE_SELECTOR,
    FLAG_DISCOVER_PREFILL_SELECTOR,
    FLAG_DISCOVER_SELECTOR,
    ROUTER_DEFAULT_PORT,
    ROUTER_POLICIES,
)
from sluice.runtime.dataclass_cli import add_flags, option


@dataclass(frozen=True)
class PrefillServer:
    """A P/D prefill server: its HTTP URL and the port its KV bootstrap server listens on."""

    url: str
    bootstrap_port: int = DISAGG_DEFAULT_BOOTSTRAP_PORT

    @property
    def bootstrap(self) -> str:
        """`host:port` of its bootstrap server, as the decode server is told it."""
        host = urlsplit(self.url).hostname or ""
        return f"[{host}]:{self.bootstrap_port}" if ":" in host else f"{host}:{self.bootstrap_port}"


def parse_prefill(values: tuple[str, ...]) -> tuple[PrefillServer, ...]:
    """`--prefill`'s values, `URL [BOOTSTRAP_PORT]` per server: the flag's groups arrive
    flattened (`--prefill u1 9000 --prefill u2` gives `u1 9000 u2`), and a port follows
    the URL it belongs to. A value may also hold both, space-separated ("u1 9000")."""
    servers: list[PrefillServer] = []
    port_given = False
    for token in (t for value in values for t in value.split()):
        if not token.isdigit():
            if problem := url_problem("--prefill", token):
                raise ValueError(problem)
            servers.append(PrefillServer(token.rstrip("/")))
            port_given = False
            continue
        if not servers or port_given:
            raise ValueError(f"--prefill: port {token} follows no URL (give URL [BOOTSTRAP_PORT])")
        if not 1 <= int(token) <= 65535:
            raise ValueError(f"--prefill: bootstrap port {token} is not in 1..65535")
        servers[-1] = PrefillServer(servers[-1].url, int(token))
        port_given = True
    return tuple(servers)


def url_problem(flag: str, url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{flag}: {url!r} is not an http(s)://host:port URL"
    return None


def selector_problems(flag: str, selector: str) -> list[str]:
    """What is wrong with a label selector (`k=v[,k=v]`; equality selectors only)."""
    problems = []
    for term in selector.split(",") if selector else ():
        key, eq, _ = term.partition("=")
        if not eq or not key.strip() or "!" in key:
            problems.append(f"{flag}: {term!r} is not k=v (equality selectors only)")
    return problems


@dataclass(frozen=True)
class RouterArgs:
    host: str = option(DEFAULT_HOST, "Address the router binds.")
    port: int = option(ROUTER_DEFAULT_PORT, "Port the router listens on.")
    worker_urls: tuple[str, ...] = option(
        (), "Runtime servers to route to (http://host:port), static; discovery may add more."
    )
    policy: str = option("cache-aware", "How a worker is chosen per request.", ROUTER_POLICIES)
    cache_threshold: float = option(
        0.3,
        "cache-aware: route to the best prefix match when it covers more than this share "
        "of the request's routing key; otherwise to the least-loaded worker.",
    )
    balance_abs_threshold: int = option(
        64,
        "cache-aware: the load is imbalanced (route to the least-loaded worker, whatever "
        "the match) when max - min in-flight requests exceeds this ...",
    )
    balance_rel_threshold: float = option(
        1.5,
        "... and max in-flight exceeds min in-flight times this.",
    )
    max_tree_characters: int = option(
        1 << 24,
        "cache-aware: characters each worker's approximate prefix tree keeps "
        "(least recently used branches are evicted beyond it).",
    )
    health_interval: float = option(2.0, "Seconds between /health probes of a healthy worker.")
    health_timeout: float = option(2.0, "Seconds a /health probe may take.")
    health_failure_threshold: int = option(
        2,
        "Consecutive failed probes that take a worker out (a refused connection on a "
        "proxied request takes it out at once).",
    )
    retry_backoff_initial: float = option(
        0.5, "Seconds before an out worker is probed again; doubles per failure ..."
    )
    retry_backoff_max: float = option(15.0, "... up to this many seconds.")
    connect_timeout: float = option(5.0, "Seconds to open a connection to a worker.")
    request_timeout: float = option(
        0.0, "Seconds a worker may take to send its response headers (0: no limit)."
    )
    response_affinity_size: int = option(
        100_000,
        "Responses API: stored-response ids whose worker the router remembers (least "
        "recently used forgotten beyond it; an id not remembered is asked of the workers).",
    )
    response_probe_timeout: float = option(
        1.0,
        "Responses API: seconds the router waits for the workers' answers when it asks "
        "which one holds a response it does not remember.",
    )
    discover_selector: str = option(
        "",
        "Kubernetes: label selector (k=v[,k=v]) of the EndpointSlices of the runtime pods, "
        "e.g. kubernetes.io/service-name=my-model; ready endpoints join, others leave.",
    )
    discover_namespace: str = option(
        "",
        "Kubernetes: namespace to watch, for every selector (default: the router pod's own "
        "namespace).",
    )
    discover_port_name: str = option(
        CONTAINER_PORT_NAME,
        "Kubernetes: EndpointSlice port name of the runtime's HTTP port (P/D: on both sides).",
    )
    kubeconfig: str = option(
        "",
        "Kubernetes: kubeconfig file for discovery (default: in-cluster config, else "
        "$KUBECONFIG or ~/.kube/config).",
    )
    drain_timeout: float = option(
        30.0, "Seconds SIGTERM waits for open requests before the router exits."
    )
    pd_disaggregation: bool = option(
        False,
        "Prefill/decode disaggregation: each request goes to a prefill server (--prefill, "
        "--discover-prefill-selector) and a decode server (--decode, "
        "--discover-decode-selector) at once; the prefill server hands its KV to the decode "
        "server, whose response the client gets.",
    )
    prefill: tuple[str, ...] = option(
        (),
        "P/D: a prefill server, URL [BOOTSTRAP_PORT] (the port of its "
        f"--disaggregation-bootstrap-port, default {DISAGG_DEFAULT_BOOTSTRAP_PORT}); repeat "
        "the flag per server. Chosen by --policy.",
        repeatable=True,
    )
    decode: tuple[str, ...] = option(
        (), "P/D: a decode server's URL; repeat the flag per server. Chosen by least load.",
        repeatable=True,
    )  # fmt: skip
    discover_prefill_selector: str = option(
        "",
        "P/D, Kubernetes: label selector (k=v[,k=v]) of the prefill servers' EndpointSlices, "
        "e.g. kubernetes.io/service-name=my-model-prefill; a ready endpoint's bootstrap "
        f"address is its address and the slice's port named {DISAGG_BOOTSTRAP_PORT_NAME!r} "
        f"(without one: {DISAGG_DEFAULT_BOOTSTRAP_PORT}).",
    )
    discover_decode_selector: str = option(
        "",
        "P/D, Kubernetes: label selector (k=v[,k=v]) of the decode servers' EndpointSlices, "
        "e.g. kubernetes.io/service-name=my-model-decode.",
    )
    log_level: str = option("info", "Log level.", ("debug", "info", "warning", "error"))

    @property
    def discovery_enabled(self) -> bool:
        return bool(
            self.discover_selector
            or self.discover_prefill_selector
            or self.discover_decode_selector
        )

    @property
    def prefill_servers(self) -> tuple[PrefillServer, ...]:
        return parse_prefill(self.prefill)

    def validate(self) -> None:
        problems = self._pd_problems()
        if not self.pd_disaggregation and not self.worker_urls and not self.discover_selector:
            problems.append("give --worker-urls, or --discover-selector to find workers")
        problems += filter(None, (url_problem("--worker-urls", u) for u in self.worker_urls))
        if len(set(self.worker_urls)) != len(self.worker_urls):
            problems.append("--worker-urls: a URL is given twice")
        if not 0.0 <= self.cache_threshold <= 1.0:
            problems.append("--cache-threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            problems.append("--balance-abs-threshold must be >= 0, --balance-rel-threshold >= 1")
        if self.max_tree_characters < 1:
            problems.append("--max-tree-characters must be >= 1")
        if self.health_interval <= 0 or self.health_timeout <= 0:
            problems.append("--health-interval and --health-timeout must be > 0")
        if self.health_failure_threshold < 1:
            problems.append("--health-failure-threshold must be >= 1")
        if not 0 < self.retry_backoff_initial <= self.retry_backoff_max:
            problems.append("need 0 < --retry-backoff-initial <= --retry-backoff-max")
        if self.connect_timeout <= 0 or self.request_timeout < 0:
            problems.append("--connect-timeout must be > 0 and --request-timeout >= 0")
        if self.response_affinity_size < 1 or self.response_probe_timeout <= 0:
            problems.append(
                "--response-affinity-size must be >= 1 and --response-probe-timeout > 0"
            )
        problems += selector_problems(FLAG_DISCOVER_SELECTOR, self.discover_selector)
        problems += selector_problems(
            FLAG_DISCOVER_PREFILL_SELECTOR, self.discover_prefill_selector
        )
        problems += selector_problems(FLAG_DISCOVER_DECODE_SELECTOR, self.discover_decode_selector)
        if problems:
            raise ValueError("; ".join(problems))

    def _pd_problems(self) -> list[str]:
        problems = []
        if not self.pd_disaggregation:
            if self.prefill or self.decode:
                problems.append("--prefill/--decode need --pd-disaggregation")
            if self.discover_prefill_selector or self.discover_decode_selector:
                problems.append(
                    f"{FLAG_DISCOVER_PREFILL_SELECTOR}/{FLAG_DISCOVER_DECODE_SELECTOR} need "
                    "--pd-disaggregation"
                )
            return problems
        if self.worker_urls:
            problems.append("--pd-disaggregation takes --prefill and --decode, not --worker-urls")
        if self.discover_selector:
            problems.append(
                f"--pd-disaggregation does not take {FLAG_DISCOVER_SELECTOR}: use "
                f"{FLAG_DISCOVER_PREFILL_SELECTOR} and {FLAG_DISCOVER_DECODE_SELECTOR}"
            )
        try:
            prefill = [s.url for s in self.prefill_servers]
        except ValueError as err:
            return [*problems, str(err)]
        decode = [u.rstrip("/") for u in self.decode]
        for side, static, selector in (
            ("prefill", prefill, self.discover_prefill_selector),
            ("decode", decode, self.discover_decode_selector),
        ):
            if not static and not selector:
                problems.append(
                    f"--pd-disaggregation needs {side} servers: give --{side} or "
                    f"--discover-{side}-selector"
                )
        problems += filter(None, (url_problem("--decode", u) for u in self.decode))
        if len(set(prefill + decode)) != len(prefill + decode):
            problems.append("--prefill/--decode: a URL is given twice")
        return problems

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_flags(parser, RouterArgs)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> RouterArgs:
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
        values["worker_urls"] = tuple(u.rstrip("/") for u in values["worker_urls"] or ())
        values["prefill"] = tuple(v.rstrip("/") for v in values["prefill"] or ())
        values["decode"] = tuple(u.rstrip("/") for u in values["decode"] or ())
        args = cls(**values)
        args.validate()
        return args
