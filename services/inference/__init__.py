"""The inference service a DQoES container runs: CNN models and the batch loop.

Kept free of imports so `python -m services.inference.run` can re-exec under
jemalloc before torch loads. models.py and workload.py need torch (the
`workloads` extra); cgroup.py and jemalloc.py do not.
"""
