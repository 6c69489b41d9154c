"""moetune: plan, estimate, check and diagnose MoE training on Megatron-Core / Megatron-Bridge."""

__version__ = "0.1.0"
