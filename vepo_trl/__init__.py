"""VEPO: Vision-Entropy token selection for Policy Optimization, for Hugging Face TRL.

The extension API (docs/plugins.md): `register_strategy`, `register_perturbation`, `register_benchmark`,
`register_reward`, `register_lab_task` and `register_synthetic_task`, with what their functions receive
(`TokenSignals`, `top_k_mask`, `minmax_normalize`, `Benchmark`, `Example`, `LabTask`). A package names what it
registers under the entry-point groups `vepo_trl.strategies`, `vepo_trl.perturbations`, `vepo_trl.benchmarks` and
`vepo_trl.rewards`, and every command finds it.
"""

__version__ = "0.1.0"

from .utils import lazy_exports


_EXPORTS = {
    "VEPOConfig": "config",
    "VEPOTrainer": "trainer",
    # The extension API: one registry mechanism (`registry.Registry`) behind every decorator
    "register_strategy": "scoring",
    "TokenSignals": "scoring",
    "top_k_mask": "scoring",
    "minmax_normalize": "scoring",
    "register_perturbation": "perturb.registry",
    "register_benchmark": "eval.benchmarks",
    "Benchmark": "eval.benchmarks",
    "Example": "eval.benchmarks",
    "register_reward": "rewards",
    "register_lab_task": "builtin.lab_tasks",
    "LabTask": "builtin.lab_tasks",
    "register_synthetic_task": "data.synthetic",
    "PluginError": "registry",
}
__all__ = [*_EXPORTS, "__version__"]

# Lazy: `vepo_trl.rewards` or `vepo_trl.scoring` alone should not pay for importing TRL's trainers
__getattr__ = lazy_exports(__name__, _EXPORTS)
