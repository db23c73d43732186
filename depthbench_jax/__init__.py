"""depthbench_jax: which residual designs turn extra Transformer layers into extra computation."""

__version__ = "0.1.0"
