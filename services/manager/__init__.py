"""The manager: DQoES's QoE Analyst (objectives in, cluster view out)."""
