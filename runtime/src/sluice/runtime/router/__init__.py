"""`sluice router`: one OpenAI-compatible front for several runtime servers.

Routes each request to a worker by policy (cache-aware prefix affinity, round robin, least
load, random; a request naming a stored response of the Responses API to the worker
holding it), streams the worker's response back unchanged, probes the workers' health,
and on Kubernetes finds them from their EndpointSlices. `args.py` holds the flags;
`server.py` starts it. Importing this package imports nothing heavy.
"""
