"""`sluice router`: one OpenAI-compatible front for several runtime servers.

Routes each request to a worker by policy (cache-aware prefix affinity, round robin, least
load, random; a request naming a stored response of the Responses API to the worker
holding it), streams the worker's response back unchanged, probes the workers' health,
and on Kubernetes finds them from their EndpointSlices. `args.py` holds the flags;
`server.py` starts it. Importing this package imports nothing heavy.

P/D mode (`--pd-disaggregation --prefill URL [BOOTSTRAP_PORT] ... --decode URL ...`): the
servers run `sluice serve --disaggregation-mode prefill|decode`. Each generation request goes
to a prefill server (chosen by the policy: its prefix cache) and a decode server (least load)
at once, with the prefill server's bootstrap address and a fresh transfer room in two
headers; the prefill server computes the prompt and hands its KV to the decode server, whose
response the client gets. A failure of either before the decode server answers closes the
other request and is retried once on another pair, or answered (`pd.py`); `/health` needs
a healthy server on each side, `/workers` names each server's role (`pd_app.py`). On
Kubernetes each side is found from its own Service's EndpointSlices instead of (or besides)
the static flags: `--discover-prefill-selector`, `--discover-decode-selector`, one watch per
side; a prefill pod's bootstrap address is its endpoint address and the slice's port named
`bootstrap` (`pd_discovery.py`). Not yet: the Responses API (501).
"""
