"""VEPOConfig: VEPO's fields reach the command line and YAML, and bad values fail with a message saying what to do."""

import dataclasses

import pytest
from trl import GRPOConfig, TrlParser

from vepo_trl import VEPOConfig
from vepo_trl.perturb import PERTURBATIONS
from vepo_trl.scoring import SELECTION_STRATEGIES


VEPO_FIELDS = [f for f in dataclasses.fields(VEPOConfig) if f.name not in GRPOConfig.__dataclass_fields__]


def make(tmp_path, **kwargs):
    return VEPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kwargs)


def test_defaults_are_the_papers(tmp_path):
    config = make(tmp_path)
    assert config.selection_strategy == "vepo"
    assert config.selection_ratio == 0.2
    assert config.selection_alpha == 0.7
    assert config.perturbation == "diffusion"
    assert config.noise_step == 500
    assert not config.noise_annealing
    assert (config.noise_annealing_coefficient, config.noise_annealing_midpoint) == (30.0, 40)
    assert config.noise_sigma == 2.0
    assert config.perturbation_seed == config.seed  # defaults to the run's seed


def test_only_vepo_fields_are_added_and_each_has_help():
    names = {f.name for f in VEPO_FIELDS}
    assert names == {
        "selection_strategy",
        "strategy_params",
        "selection_ratio",
        "selection_alpha",
        "selection_mode",
        "selection_weight",
        "entropy_scope",
        "eval_selection",
        "score_zero_advantage_rows",
        "log_selection_diagnostics",
        "selection_samples_steps",
        "selection_samples_count",
        "perturbation",
        "perturbation_params",
        "noise_step",
        "noise_annealing",
        "noise_annealing_coefficient",
        "noise_annealing_midpoint",
        "noise_sigma",
        "patch_probability",
        "perturbation_seed",
        "scoring_tile_size",
        "rollout_cache_gb",
    }
    for f in VEPO_FIELDS:
        assert f.metadata.get("help"), f.name
        # Documented in the class docstring too, like TRL's configs
        assert f"{f.name} (`" in VEPOConfig.__doc__, f.name


def test_command_line_and_yaml(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"output_dir: {tmp_path}\nuse_cpu: true\nbf16: false\nreport_to: none\n"
        "selection_strategy: vepo_kl\nselection_ratio: 0.4\nperturbation: diffusion\nnoise_step: 300\n"
    )
    parser = TrlParser(VEPOConfig)
    (config,) = parser.parse_args_and_config(
        ["--config", str(recipe), "--selection_alpha", "0.3", "--noise_annealing"]
    )
    assert config.selection_strategy == "vepo_kl"
    assert config.selection_ratio == 0.4  # from the YAML
    assert config.selection_alpha == 0.3  # from the command line
    assert config.perturbation == "diffusion" and config.noise_step == 300
    assert config.noise_annealing is True


@pytest.mark.parametrize(
    ("kwargs", "refused"),
    [
        ({"selection_strategy": "entropy", "perturbation": "gaussian", "noise_sigma": 5.0}, "perturbation"),
        ({"selection_strategy": "entropy", "noise_sigma": 5.0}, "noise_sigma"),
        ({"selection_strategy": "entropy", "selection_alpha": 0.3}, "selection_alpha"),
        ({"selection_strategy": "full", "selection_ratio": 0.3}, "selection_ratio"),
        ({"selection_strategy": "vepo_no_jsd", "selection_alpha": 0.3}, "selection_alpha"),
        ({"selection_strategy": "vppo", "selection_alpha": 0.3}, "selection_alpha"),
        ({"perturbation": "gaussian", "noise_step": 300}, "noise_step"),
        ({"perturbation": "diffusion", "noise_sigma": 1.0}, "noise_sigma"),
        ({"perturbation": "mean_image", "patch_probability": 0.3}, "patch_probability"),
        ({"noise_annealing_midpoint": 10}, "noise_annealing_midpoint"),
        ({"selection_strategy": "entropy", "perturbation_seed": 7}, "perturbation_seed"),
        ({"selection_strategy": "random", "selection_ratio": 0.3}, None),
        ({"selection_strategy": "vppo", "perturbation": "gaussian", "noise_sigma": 1.0}, None),
        ({"perturbation": "patch_blackout", "patch_probability": 0.3}, None),
        ({"noise_annealing": True, "noise_annealing_midpoint": 10}, None),
        ({"selection_strategy": "vepo_additive", "selection_alpha": 0.3, "selection_ratio": 0.4}, None),
        ({"selection_strategy": "entropy", "noise_step": 500, "perturbation_seed": 42}, None),  # defaults, the seed
        ({"selection_strategy": "random", "perturbation_seed": 7}, None),  # seeds random's token draws
        # TRL's and transformers' settings read only in some modes (validation.TRAIN_READS), from Python too
        ({"vllm_gpu_memory_utilization": 0.5}, "vllm_gpu_memory_utilization"),
        ({"use_vllm": True, "vllm_mode": "server", "vllm_gpu_memory_utilization": 0.5}, "vllm_gpu_memory_utilization"),
        ({"save_strategy": "no", "save_steps": 5}, "save_steps"),
        ({"save_strategy": "no", "save_on_each_node": True}, None),  # the final save reads it
        ({"logging_strategy": "no", "logging_first_step": True}, None),  # logged whatever the strategy
        ({"per_device_eval_batch_size": 4}, None),  # a caller's trainer.evaluate() reads it
    ],
)
def test_a_setting_the_run_never_reads_is_refused(kwargs, refused):
    """t20: `--selection_strategy entropy --perturbation gaussian --noise_sigma 5` trained, recorded both, and ran no
    perturbed pass. Which settings a run reads comes from the registries (each function's keyword parameters)."""
    base = {"output_dir": "unused", "use_cpu": True, "bf16": False, "report_to": "none", "seed": 42}
    if refused is None:
        VEPOConfig(**base, **kwargs)
        return
    with pytest.raises(ValueError, match=rf"^--{refused} .* is set, and this run never reads it \("):
        VEPOConfig(**base, **kwargs)


def test_what_a_strategy_declares_it_reads_is_what_changes_its_selection():
    """The registry's rule (a strategy reads the settings its function takes) against behaviour: on random signals,
    changing k or alpha changes the mask of exactly the strategies said to read it."""
    import torch

    from vepo_trl.scoring import SELECTION_STRATEGIES, TokenSignals

    generator = torch.Generator().manual_seed(0)
    shape = (4, 64)
    signals = TokenSignals(**{name: torch.rand(shape, generator=generator) for name in (
        "entropy", "perturbed_entropy", "jsd", "kl", "logp", "perturbed_logp")})  # fmt: skip
    mask = torch.ones(shape, dtype=torch.bool)
    seeds = torch.arange(4)
    for name, strategy in SELECTION_STRATEGIES.items():
        base = strategy.fn(signals, mask, ratio=0.2, alpha=0.7, seeds=seeds)
        other_k = strategy.fn(signals, mask, ratio=0.5, alpha=0.7, seeds=seeds)
        other_alpha = strategy.fn(signals, mask, ratio=0.2, alpha=0.1, seeds=seeds)
        assert (not torch.equal(base, other_k)) == ("ratio" in strategy.reads), name
        assert (not torch.equal(base, other_alpha)) == ("alpha" in strategy.reads), name


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"selection_strategy": "vepoo"}, "--selection_strategy 'vepoo': must be a selection strategy \\(one of "),
        ({"selection_ratio": 0.0}, r"--selection_ratio 0.0: must be in \(0, 1\]: k, the fraction"),
        ({"selection_ratio": 1.5}, r"--selection_ratio 1.5: must be in \(0, 1\]"),
        ({"selection_alpha": -0.1}, r"--selection_alpha -0.1: must be in \[0, 1\]"),
        ({"perturbation": "blur"}, "--perturbation 'blur': must be a perturbation \\(one of "),
        ({"noise_step": 1000}, "--noise_step 1000: must be a whole diffusion step in 0..999"),
        ({"noise_sigma": -1.0}, "--noise_sigma -1.0: must be >= 0"),
        ({"patch_probability": 1.2}, r"--patch_probability 1.2: must be in \[0, 1\]"),
        ({"noise_annealing": True, "noise_annealing_coefficient": 0.0}, "must be above 0"),
        ({"scoring_tile_size": 0}, "--scoring_tile_size 0: must be a whole number of tokens >= 1"),
        ({"rollout_cache_gb": -1}, "--rollout_cache_gb -1: must be a number of GB >= 0"),
        ({"top_entropy_quantile": 0.2}, "selection_strategy='entropy'"),
    ],
)
def test_bad_values_say_what_to_change(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kwargs)


def test_error_lists_every_valid_name(tmp_path):
    with pytest.raises(ValueError) as strategy_error:
        make(tmp_path, selection_strategy="nope")
    assert all(name in str(strategy_error.value) for name in SELECTION_STRATEGIES)
    with pytest.raises(ValueError) as perturbation_error:
        make(tmp_path, perturbation="nope")
    assert all(name in str(perturbation_error.value) for name in PERTURBATIONS)


def test_top_entropy_quantile_allowed_with_full(tmp_path):
    # GRPO's own filter on plain GRPO is GRPO's business; it only clashes with a VEPO selection
    assert make(tmp_path, selection_strategy="full", top_entropy_quantile=0.2).top_entropy_quantile == 0.2


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        # YAML hands these through unconverted: each used to pass and crash at the first step
        ("noise_step", "500.7", "--noise_step 500.7: must be a whole diffusion step"),
        ("scoring_tile_size", "64.9", "--scoring_tile_size 64.9: must be a whole number"),
        ("noise_annealing_coefficient", ".nan", "--noise_annealing_coefficient nan: must be above 0"),
        ("noise_annealing_coefficient", ".inf", "--noise_annealing_coefficient inf: must be above 0"),
        # A NaN sigma made every perturbed image NaN, and every selection the first k tokens
        ("noise_sigma", ".nan", "--noise_sigma nan: must be >= 0"),
    ],
)
def test_yaml_values_of_the_wrong_kind_are_rejected(tmp_path, key, value, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\nreport_to: none\n{key}: {value}\n")
    with pytest.raises(ValueError, match=message):
        TrlParser(VEPOConfig).parse_args_and_config(["--config", str(recipe)])


def test_whole_floats_from_yaml_become_ints(tmp_path):
    config = make(tmp_path, noise_step=500.0, scoring_tile_size=32.0)
    assert (config.noise_step, config.scoring_tile_size) == (500, 32)
    assert isinstance(config.noise_step, int) and isinstance(config.scoring_tile_size, int)


def test_bf16_follows_the_hardware_unless_set(tmp_path, monkeypatch):
    import vepo_trl.config as config_module

    # The README's VEPOConfig(output_dir=...) on a CPU: GRPOConfig's bf16=True would raise there
    monkeypatch.setattr(config_module, "_hardware_supports_bf16", lambda: False)
    assert VEPOConfig(output_dir=str(tmp_path), report_to="none").bf16 is False
    assert VEPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False).bf16 is False
    monkeypatch.setattr(config_module, "_hardware_supports_bf16", lambda: True)
    assert VEPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).bf16 is False


def test_defaults_raise_no_future_warning_and_keep_trls_checkpointing(tmp_path):
    """TRL declares its default under transformers' deprecated `gradient_checkpointing`, so `GRPOConfig()` warns about
    a setting nobody gave; `VEPOConfig()` keeps TRL's default (on) under the new name, silently, and a user's own value
    under either name is what the run uses."""
    import warnings

    from vepo_trl.config import _CHECKPOINTING_RENAMED

    if _CHECKPOINTING_RENAMED:  # the upstream behaviour the workaround exists for
        with pytest.warns(FutureWarning, match="gradient_checkpointing"):
            GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = VEPOConfig(output_dir=str(tmp_path), use_cpu=True)
        assert config.activation_checkpointing is True and config.gradient_checkpointing is True
        off = VEPOConfig(output_dir=str(tmp_path), use_cpu=True, activation_checkpointing=False)
        assert off.activation_checkpointing is False and off.gradient_checkpointing is False
    with warnings.catch_warnings():
        # The user's own deprecated name: transformers' warning is theirs to act on
        warnings.simplefilter("ignore", FutureWarning)
        old = VEPOConfig(output_dir=str(tmp_path), use_cpu=True, gradient_checkpointing=False)
    assert old.activation_checkpointing is False and old.gradient_checkpointing is False


def test_the_name_lists_follow_the_registries():
    # The config's docstring and --help list the registries' own names, generated from them (a new strategy or
    # perturbation is its one function); the recipes' ablation table names only registered strategies
    import re

    from tests.support import REPO
    from vepo_trl.perturb import PERTURBATIONS
    from vepo_trl.scoring import SELECTION_STRATEGIES

    helps = {f.name: f.metadata["help"] for f in VEPO_FIELDS}
    docstring = VEPOConfig.__doc__
    for field, registry in (("selection_strategy", SELECTION_STRATEGIES), ("perturbation", PERTURBATIONS)):
        builtin = set(registry.registered_by("vepo_trl"))
        assert {"vepo", "vppo", "full"} <= builtin or {"diffusion", "gaussian"} <= builtin
        section = re.split(r"\n        \w+ \(`", docstring[docstring.index(f"{field} (`") :])[0]
        assert set(re.findall(r'`"([a-z_0-9]+)"`\s+\(', section)) == builtin, field
        assert set(re.findall(r"[a-z][a-z_0-9]+", helps[field])) & builtin == builtin, field
        assert "{" not in section
    table = (REPO / "recipes" / "README.md").read_text().split("## Ablations", 1)[1]
    named = set(re.findall(r"--selection_strategy ([a-z_0-9]+)", table)) | set(
        re.findall(r"--perturbation ([a-z_]+)", table)
    )
    assert named and named <= set(SELECTION_STRATEGIES) | set(PERTURBATIONS)
