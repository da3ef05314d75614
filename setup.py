"""gspo_jax: GRPO-family policy objectives (GRPO, DAPO, Dr. GRPO, GSPO, GSPO-token, LUSPO, GMPO,
CISPO, SAPO, Clip-Cov, KL-Cov, DPPO) in JAX/Flax NNX, with a pure-JAX group sampler, verifiable
tasks and an RL trainer."""

from setuptools import find_packages, setup

NOTEBOOKS = ["nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6.29"]

setup(
    name="gspo_jax",
    version="0.1.0",
    description=" ".join(__doc__.split()),  # one line: setuptools keeps only the first
    python_requires=">=3.11",
    packages=find_packages(include=["gspo_jax", "gspo_jax.*"]),
    # the claims registry's entries (gspo_jax/claims/registry.py reads them beside the package)
    package_data={"gspo_jax.claims": ["entries/*/*.json"]},
    install_requires=[
        "jax>=0.6.0",
        "jaxlib>=0.6.0",
        "flax>=0.11.0",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11.0",
        "grain>=0.2.10",
        "tensorflow-datasets>=4.9.8",
        "importlib_resources",  # tensorflow-datasets imports it without declaring it
        "array-record>=0.7.0",
        "pyarrow>=14",  # Hugging Face parquet datasets (data/files.py); no TensorFlow needed
        "ml-collections>=1.0.0",
        "chex>=0.1.89",
        "numpy>=1.26",
        "tqdm>=4.66",
        "absl-py>=1.0",
        "etils[epath]>=1.5",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "safetensors>=0.4.3",  # Hugging Face checkpoints (models/hf.py)
        "tokenizers>=0.20,<1",  # a checkpoint's tokenizer.json (tasks/hf_tokenizer.py)
        "jinja2>=3.1,<4",  # its chat template
        "math-verify>=0.7.0,<1",  # GSM8K / MATH answer equivalence (tasks/math_answers.py)
        "qwix>=0.1.8",  # LoRA adapters on the decoder (models/lora.py)
        "scipy>=1.15",  # the claims' exact tests (claims/stats.py: PermutationMethod, rng=)
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",  # the suite runs in 2 workers (pyproject.toml, tests/conftest.py)
            "pytest-timeout>=2.3",  # a hung test fails alone instead of holding CI (pyproject.toml)
            "hypothesis>=6.100",
            "ruff==0.17.6",
            *NOTEBOOKS,  # tests/test_notebooks.py executes every notebook
        ],
        # Executing the claim notebooks (experiments/claims.py, tests/test_notebooks.py).
        "notebooks": NOTEBOOKS,
        # Peers for the sampler benchmark only; tests and CI never need them.
        "peers": ["google-tunix", "transformers", "torch==2.13.0"],
    },
)
