"""Scenarios: which nodes, which models, which containers with which objectives, when.

A scenario describes a workload, not how it is run: the simulator
(`shared.sim`) runs it in virtual time, the simulated runtime and `dqoes up`
run it live over NATS, and the cgroup runtime starts its containers as real
inference processes. Kept apart from the simulator so production code can
read a scenario without importing the simulator.
"""
