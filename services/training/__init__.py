"""Real training workloads (torch, data generated in the job) that publish their evaluation values."""
