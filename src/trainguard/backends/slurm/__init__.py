"""The Slurm backend: inside an allocation, each replica a job step (`srun`) on one of its
nodes; what Slurm says about the nodes, and where the replicas go."""

__all__ = ["backend", "cluster", "node_check", "node_probe", "placement", "step_stacks", "steps"]
