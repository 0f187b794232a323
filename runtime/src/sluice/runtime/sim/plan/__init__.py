"""`sluice plan`: simulated replicas behind a router, scaled by Kubernetes' HPA algorithm
(`hpa`) on the operator's metrics or the saturation policy (`saturation`), over a traffic
trace (`traffic`); `fleet` runs it, `report` sums it up."""
