"""The serving workload `benchmarks/bench_serving.py` sends and `sluice simulate` replays:
the prompts and their lengths (`dataset`), the arrival times (`arrivals`), and the numbers
computed from per-request results (`metrics`). Pure (numpy only) and seeded, so the
benchmark and the simulator see the same requests for the same flags.
"""
