"""The worker controller: one per node; decides and applies CPU limits (DQoES's Executor)."""
