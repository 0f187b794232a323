"""Capacity planning on the real scheduler: `sluice calibrate` fits a step-time model of
this machine's engine, `sluice simulate` runs `bench_serving`'s workload through the real
`Scheduler` on a virtual clock with that model in place of the forward, and `sluice plan`
runs many simulated replicas behind a router under an autoscaler (Kubernetes' HPA
algorithm, a saturation policy) over a traffic trace."""
