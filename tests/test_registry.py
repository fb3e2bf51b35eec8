"""The one registry mechanism (`vepo_trl.registry`): entry-point plug-ins loaded once and lazily, credited to their
package, a broken one kept as one line until asked for; and a registered function given only what it declares."""

import inspect
import subprocess
import sys
import textwrap

import pytest

from vepo_trl.registry import PluginError, Registry, call_with, keyword_settings


def _plugin_site(tmp_path, entry_points: str, modules: dict[str, str]):
    for name, code in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
    info = tmp_path / "demo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return tmp_path


def _run(site, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(site), "PATH": ""},
    )


def test_plugins_load_on_first_read_and_are_credited(tmp_path):
    site = _plugin_site(
        tmp_path,
        """
        [vepo_trl.strategies]
        keep_first = demo_rules:keep_first
        broken = demo_missing:rule
        """,
        {
            "demo_rules": """
                import sys
                from vepo_trl import Benchmark, register_strategy  # imports vepo_trl.eval.benchmarks the first time
                sys.modules["vepo_trl"].LOADED = True

                @register_strategy("keep_first", count="all")
                def keep_first(signals, mask, *, first=1):
                    "The first tokens."
                    out = mask.clone()
                    out[:, first:] = False
                    return out
            """,
            "demo_missing": "raise RuntimeError('this plug-in is broken\\non two lines')\n",
        },
    )
    result = _run(
        site,
        """
        import vepo_trl
        from vepo_trl.scoring import SELECTION_STRATEGIES, get_strategy
        assert not hasattr(vepo_trl, "LOADED")  # importing the registry's module loads no plug-in
        from vepo_trl.registry import plugin_names
        assert plugin_names("selection strategy") == ("keep_first", "broken")  # no import needed
        assert not hasattr(vepo_trl, "LOADED")
        assert "keep_first" in SELECTION_STRATEGIES  # the first read does
        assert vepo_trl.LOADED
        # The built-ins a plug-in's import pulls in first stay vepo_trl's (the lists help and docs show)
        from vepo_trl.eval.benchmarks import BENCHMARKS
        assert BENCHMARKS.source("mathvista") == "vepo_trl" and "mathvista" in BENCHMARKS.registered_by("vepo_trl")
        print(SELECTION_STRATEGIES.source("keep_first"), SELECTION_STRATEGIES.source("vepo"))
        print(get_strategy("keep_first").settings)
        try:
            get_strategy("broken")
        except vepo_trl.PluginError as error:
            print(error)
        try:
            get_strategy("nothing")
        except ValueError as error:
            print(type(error).__name__, str(error).split(". ")[0])
        """,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "demo-plugin vepo_trl"
    assert lines[1] == "{'first': 1}"
    assert lines[2] == (
        "the selection strategy plug-in 'broken' (demo-plugin: broken = demo_missing:rule) failed to load: "
        "RuntimeError: this plug-in is broken on two lines"
    )
    assert lines[3] == "ValueError Unknown selection strategy 'nothing'"


def test_the_early_check_takes_an_installed_plugin_a_saved_table_predates(tmp_path):
    # A parse's saved table (no torch import) predates a plug-in installed or fixed since: its names still pass the
    # early check, for the full parse to load and judge
    site = _plugin_site(tmp_path, "[vepo_trl.strategies]\nlater = demo_later:rule\n", {"demo_later": "rule = None\n"})
    result = _run(
        site,
        """
        import sys
        from vepo_trl import validation
        validation._saved = lambda: {"rules": {"selection_strategy": {"choices": ["vepo", "full"]}}}
        print(validation._selection_strategies(), "vepo_trl.scoring" in sys.modules, "demo_later" in sys.modules)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "('vepo', 'full', 'later') False False"


def test_a_plugin_imported_by_hand_first_is_still_its_package(tmp_path):
    site = _plugin_site(
        tmp_path,
        """
        [vepo_trl.rewards]
        always_one = demo_reward:always_one
        """,
        {
            "demo_reward": """
                from vepo_trl import register_reward

                @register_reward("always_one")
                def always_one(prompts, completions, **columns):
                    return [1.0] * len(completions)
            """
        },
    )
    result = _run(
        site,
        """
        import demo_reward  # a notebook's import, before any registry is read
        from vepo_trl.rewards import REWARD_FUNCS, get_reward_funcs
        print(REWARD_FUNCS.source("always_one"), REWARD_FUNCS.broken(), get_reward_funcs("always_one")[0](None, [1, 2]))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "demo-plugin {} [1.0, 1.0]"


def test_a_plugin_that_registers_nothing_or_another_name_is_broken(tmp_path):
    site = _plugin_site(
        tmp_path,
        """
        [vepo_trl.perturbations]
        quiet = demo_quiet:nothing
        """,
        {"demo_quiet": "nothing = None\n"},
    )
    result = _run(
        site,
        """
        from vepo_trl.perturb import PERTURBATIONS
        print(sorted(PERTURBATIONS.broken().values()))
        print("diffusion" in PERTURBATIONS)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "loaded, but registered no perturbation named 'quiet'" in result.stdout
    assert result.stdout.splitlines()[1] == "True"


def test_registry_mapping_and_errors():
    registry = Registry("widget")
    registry.add("a", 1, module="pkg.sub")
    assert dict(registry) == {"a": 1} and registry.source("a") == "pkg"
    with pytest.raises(ValueError, match=r"already registered \(by pkg\)"):
        registry.add("a", 2)
    with pytest.raises(ValueError, match="non-empty name"):
        registry.add(" b", 2)
    with pytest.raises(ValueError, match=r"Unknown widget 'c'\. Valid widgets: a\."):
        registry.lookup("c")
    assert registry.pop("a") == 1 and "a" not in registry
    assert issubclass(PluginError, ValueError)


def test_a_rule_declares_its_settings_after_the_star():
    from vepo_trl import register_perturbation, register_strategy

    with pytest.raises(TypeError, match=r"declare ratio, threshold after `\*`"):
        register_strategy("loose")(lambda signals, mask, ratio, threshold=0.5: mask)
    with pytest.raises(TypeError, match="takes 4 positional arguments"):
        register_perturbation("short")(lambda rows, *, strength=1.0: rows)


def test_a_benchmark_subclass_keeps_its_own_values():
    import dataclasses

    from vepo_trl import Benchmark, register_benchmark
    from vepo_trl.eval.benchmarks import BENCHMARKS

    class Plain(Benchmark):
        name = "plain_cards"
        title = "Plain"

    @dataclasses.dataclass
    class Declared(Benchmark):
        name: str = "declared_cards"
        folders: tuple = dataclasses.field(default_factory=lambda: ("cards",))

        def __post_init__(self):
            self.title = "Set in post-init"

    class Shouting(Benchmark):
        name = "Cards"

    try:
        register_benchmark(Plain)
        register_benchmark(Declared)
        assert (BENCHMARKS["plain_cards"].title, BENCHMARKS["plain_cards"].source(None)) == (
            "Plain", "tests.test_registry.test_a_benchmark_subclass_keeps_its_own_values.<locals>.Plain"
        )  # fmt: skip
        assert (BENCHMARKS["declared_cards"].folders, BENCHMARKS["declared_cards"].title) == (
            ("cards",), "Set in post-init"
        )  # fmt: skip
        with pytest.raises(ValueError, match="lower case"):
            register_benchmark(Shouting)
    finally:
        BENCHMARKS.pop("plain_cards")
        BENCHMARKS.pop("declared_cards")


def test_inspect_drops_a_recipe_s_own_settings_with_the_rule_it_replaces():
    from vepo_trl import register_perturbation, register_strategy
    from vepo_trl.insight import SignalSettings
    from vepo_trl.perturb import PERTURBATIONS
    from vepo_trl.scoring import SELECTION_STRATEGIES

    register_strategy("sharp_rule", signals=["entropy", "jsd"])(lambda signals, mask, *, ratio, sharpness=2.0: mask)
    register_perturbation("fade_test")(lambda rows, grid, layout, generator, *, strength=0.5: rows)
    recipe = {"selection_strategy": "sharp_rule", "strategy_params": {"sharpness": 1.0}, "perturbation": "fade_test",
              "perturbation_params": {"strength": 0.8}}  # fmt: skip
    try:
        assert SignalSettings.from_recipe(recipe).strategy_params == {"sharpness": 1.0}
        other = SignalSettings.from_recipe(recipe, strategy="vepo", perturbation="diffusion")
        assert (other.strategy_params, other.perturbation_params) == (None, None)
        kept = SignalSettings.from_recipe(recipe, strategy="vepo")  # the recipe's perturbation, with its setting
        assert (kept.strategy_params, kept.perturbation_params) == (None, {"strength": 0.8})
        assert SignalSettings.from_recipe(recipe, strategy="entropy").perturbation_params is None
        with pytest.raises(ValueError, match="takes no setting 'sharp'"):
            SignalSettings.from_recipe(recipe, strategy_params={"sharp": 1})
    finally:
        SELECTION_STRATEGIES.pop("sharp_rule")
        PERTURBATIONS.pop("fade_test")


def test_a_run_folder_from_before_a_setting_existed_still_resumes():
    from vepo_trl.run_folder import differences

    assert differences({"seed": 1}, {"seed": 1, "strategy_params": None, "perturbation_params": None}) == []
    assert differences({"seed": 1}, {"seed": 1, "strategy_params": {"a": 1}}) == [
        "strategy_params unset there, {'a': 1} here"
    ]


def test_a_function_gets_only_the_keywords_it_declares():
    def strict(x, *, ratio, own=3):
        return (x, ratio, own)

    def loose(x, **kwargs):
        return sorted(kwargs)

    assert call_with(strict, 1, ratio=0.2, alpha=0.7, seeds=None) == (1, 0.2, 3)
    assert call_with(loose, 1, ratio=0.2, alpha=0.7) == ["alpha", "ratio"]
    assert keyword_settings(strict) == {"ratio": inspect.Parameter.empty, "own": 3}


def test_the_public_decorators_are_exported():
    import vepo_trl
    from vepo_trl.eval.benchmarks import register_benchmark
    from vepo_trl.perturb import register_perturbation
    from vepo_trl.rewards import register_reward
    from vepo_trl.scoring import register_strategy

    assert vepo_trl.register_strategy is register_strategy
    assert vepo_trl.register_perturbation is register_perturbation
    assert vepo_trl.register_benchmark is register_benchmark
    assert vepo_trl.register_reward is register_reward
    for name in ("register_lab_task", "register_synthetic_task", "Benchmark", "Example", "TokenSignals", "top_k_mask"):
        assert name in vepo_trl.__all__ and getattr(vepo_trl, name) is not None
