"""`vepo-trl train` (and the parsing `demo` shares): TRL's parser over the training script's, VEPO's and TRL's model
dataclasses, after the checks that need no import of torch or TRL (recipe, repeated flags, the value table), then
`vepo_trl.train.main`, then the run's report. `accelerate launch vepo_trl/train.py` comes here too."""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from pathlib import Path

from ..errors import UsageError
from ..validation import named_options


DEMO_RECIPE = "recipes/tiny.yaml"
# `vepo-trl demo --warm_start`: the lab's SFT'd model and tasks, so the reward has something to improve
WARM_DEMO_RECIPE = "recipes/lab.yaml"
# The options `train --help` lists first: the recipe file, then the script's and VEPO's own fields
_USAGE = "usage: vepo-trl {command} [--config RECIPE.yaml] [--<option> VALUE ...]\n"


def _fail(command: str, message: str):
    """A user error: raised to the CLI's one door (`cli.main`), which prints it as one line, exit status 2."""
    raise UsageError(message)


def _read_recipe(command: str, path: str) -> dict | None:
    """A recipe that is valid YAML and a mapping of keys (returned), else one line naming what is wrong."""
    from ..files import read_recipe

    try:
        return read_recipe(path)
    except UsageError as error:
        _fail(command, str(error))


def _vepo_options() -> list[tuple[str, str, str]]:
    """(flag, default, help) for the training script's own fields and VEPOConfig's fields, in declaration order."""
    from ..config import VEPOConfig
    from ..train import VEPOScriptArguments

    # Fields each class declares itself (VEPOScriptArguments re-declares dataset_name with VEPO's choices)
    own = [
        f
        for cls in (VEPOScriptArguments, VEPOConfig)
        for f in dataclasses.fields(cls)
        if f.name in vars(cls)["__annotations__"]
    ]
    rows = []
    for f in own:
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append((f"--{f.name}", repr(default) if isinstance(default, str) else str(default), f.metadata["help"]))
    return rows


def _print_short_help(command: str) -> None:
    import textwrap

    print(_USAGE.format(command=command), end="")
    if command == "demo":
        print(
            "\nTrain VEPO on a tiny random Qwen2.5-VL and synthetic rows on the CPU (the packaged recipe tiny.yaml);"
        )
        print("every option below overrides the recipe, e.g. --max_steps 10 --selection_strategy entropy.")
        print(
            "--warm_start: start from the lab's warm start instead (a small Qwen2.5-VL SFT'd on the lab's colour "
            "task,\nbuilt on first use in about 1.5 minutes and cached; recipe lab.yaml, output vepo-demo-warm/), so "
            "the reward has something to improve."
        )
        from ..families import trainable_families

        print(f"--model_family F: the same demo on family F's tiny model (tiny-F), F one of {trainable_families()}.")
    else:
        print("\nTrain a vision-language model with VEPO. Options come from the recipe, then the command line.")
    print(
        "\n  --config RECIPE.yaml          a recipe (recipes/<Model>/<method>/config_<name>.yaml); keys are the options"
    )
    print("\nVEPO and data options:")
    for flag, default, help_text in _vepo_options():
        print(f"  {flag} (default: {default})")
        print(textwrap.fill(help_text, width=110, initial_indent="      ", subsequent_indent="      "))
    print(
        "\nCommon TRL options: --model_name_or_path, --output_dir, --max_steps, --learning_rate, --num_generations,\n"
        "--per_device_train_batch_size, --max_completion_length, --logging_steps, --use_peft, --bf16, --use_vllm,\n"
        "--save_strategy steps --save_steps N (checkpoints), --resume_from_checkpoint true|PATH (resume one; a rerun\n"
        "with the same settings resumes the last checkpoint itself, and says so).\n"
        f"Every GRPOConfig, TrainingArguments and ModelConfig option: vepo-trl {command} --help-all"
    )


def _split_equals(argv: list[str], *flags: str) -> list[str]:
    """`--flag=VALUE` as `--flag VALUE` for the flags this module reads itself (TRL's parser splits the others)."""
    out = []
    for arg in argv:
        name, equals, value = arg.partition("=")
        out.extend([name, value] if equals and name in flags else [arg])
    return out


def _given(argv: list[str], recipe: dict | None, options) -> set[str]:
    """The option names the command line and the recipe set (what `check_nothing_ignored` holds to account)."""
    return named_options(argv, options) | set(recipe or {})


def _parse(command: str, argv: list[str]):
    """The three argument dataclasses; user errors exit with one line and status 2 before anything loads."""
    argv = _split_equals(argv, "--config")
    if argv.count("--config") > 1:
        _fail(command, "--config is given twice: give one recipe, and override its keys with --<option> VALUE.")
    from ..validation import check_repeated

    try:
        check_repeated(argv)
    except UsageError as error:
        _fail(command, str(error))
    if "--config" in argv:
        index = argv.index("--config")
        if index + 1 >= len(argv):
            _fail(command, "--config needs a recipe file (e.g. recipes/tiny/config_vepo.yaml).")
        if not Path(argv[index + 1]).is_file():
            _fail(command, f"--config {argv[index + 1]}: no such file.")
        recipe = _read_recipe(command, argv[index + 1])
        hidden = [key for key in recipe or {} if str(key).startswith(HIDDEN_KEYS)]
        if hidden:  # YAML anchors kept for `<<:` merges: not options, so TRL's parser never sees them
            recipe = {key: value for key, value in recipe.items() if key not in hidden}
            argv = [*argv[:index], "--config", _recipe_copy(recipe), *argv[index + 2 :]]
    else:
        recipe = None
    if any(arg in ("-h", "--help") for arg in argv):
        _print_short_help(command)
        sys.exit(0)
    # The values the recipe and the command line give, against their rules, before torch and TRL are even imported
    from ..validation import OUT_FOLDER, TEXT, early_rules, precheck, precheck_declared, values_from

    try:
        precheck(argv, recipe, early_rules())
        precheck_declared(argv, recipe, command)
        # A data file's format and schema from its first rows, before anything is imported or decoded
        from ..files import check_data_rows

        for value in values_from(argv, recipe, {"dataset_name": TEXT, "eval_dataset_name": TEXT}).values():
            if isinstance(value, str) and value.strip():
                check_data_rows(value)
        # The folder the run writes and the checkpoint it resumes, checked once here (before TRL is imported)
        resume = values_from(argv, recipe, {"resume_from_checkpoint": TEXT, "max_steps": TEXT})
        steps = str(resume.get("max_steps", "")).strip()
        given_folder = values_from(argv, recipe, {"output_dir": OUT_FOLDER})
        folder = given_folder.get("output_dir")
        if "output_dir" in given_folder and folder is None:  # a recipe's `output_dir: null`
            raise UsageError(
                "output_dir is null (unset): give the folder the model and its report go to (TRL would write to "
                "trainer_output/ in the working folder)."
            )
        if folder is not None:  # once: check_arguments and plan_run do not check them again
            from ..run_folder import check_train_folder

            check_train_folder(str(folder), resume.get("resume_from_checkpoint"),
                               int(steps) if steps.lstrip("-").isdigit() else None)  # fmt: skip
    except ValueError as error:
        _fail(command, str(error))
    from ..preflight import check_arguments
    from ..train import CHECKED, make_parser

    _save_field_rules()  # before the parser rewrites the dataclasses' field types in place
    parser = make_parser()
    parser.prog = f"vepo-trl {command}"
    # argparse's own errors print the usage line first: TRL's is over a thousand flags long
    parser.format_usage = lambda: _USAGE.format(command=command)
    # argparse's errors as one line too (it would print the usage line first)
    parser.error = lambda message: _fail(command, message)  # raises
    if "--help-all" in argv:
        parser.print_help()
        sys.exit(0)
    if recipe:
        # Every key's YAML type against its field's declared type (a list, a mapping, null, a date, for any key)
        from trl import ModelConfig

        from ..config import VEPOConfig
        from ..train import VEPOScriptArguments
        from ..validation import field_annotations, recipe_values

        declared = {
            k: v for cls in (VEPOScriptArguments, VEPOConfig, ModelConfig) for k, v in field_annotations(cls).items()
        }
        try:
            checked = recipe_values(recipe, declared)
        except ValueError as error:
            _fail(command, str(error))
        if checked != recipe:
            recipe = checked
            index = argv.index("--config")
            argv = [*argv[:index], "--config", _recipe_copy(recipe), *argv[index + 2 :]]
    options = {action.dest for action in parser._actions}
    unknown = [key for key in recipe or {} if key not in options and key != "env"]
    if unknown:
        anchor = isinstance(recipe[unknown[0]], dict)
        _fail(
            command,
            f"--config: {unknown[0]!r} is not an option of vepo-trl {command}"
            + (
                f" (a mapping kept for YAML anchors and `<<:` merges? name it x-{unknown[0]}: keys that start with "
                "x- or . are skipped)"
                if anchor
                else f"; vepo-trl {command} --help-all lists them"
            )
            + ".",
        )
    try:
        with warnings.catch_warnings():
            # TRL's own default (gradient_checkpointing) trips a transformers deprecation warning the user cannot act on
            warnings.simplefilter("ignore", FutureWarning)
            args = parser.parse_args_and_config(argv)
        given, typed = _given(argv, recipe, options), _given(argv, None, options)
        check_arguments(*args, given=given, typed=typed, folder_checked=folder is not None)
        CHECKED[id(args[1])] = args[1]  # once: `train.main` takes them as checked
    except (ValueError, TypeError) as error:
        _fail(command, " ".join(str(error).split()))
    return args


# Recipe keys that are not options: holders of YAML anchors (`x-base: &base {...}` then `<<: *base`)
HIDDEN_KEYS = ("x-", ".")


def _recipe_copy(recipe: dict) -> str:
    """The recipe without its hidden keys, as a file TRL's parser reads (removed when the process ends)."""
    import atexit
    import os
    import tempfile

    import yaml

    handle, path = tempfile.mkstemp(prefix="vepo-recipe-", suffix=".yaml")
    with os.fdopen(handle, "w") as file:
        yaml.safe_dump(recipe, file, sort_keys=False)
    atexit.register(lambda: os.path.exists(path) and os.remove(path))
    return path


def _save_field_rules() -> None:
    """The type-derived rules and the declarations for the next command's early check (`validation.early_rules`,
    `validation.precheck_declared`)."""
    from types import SimpleNamespace

    from trl import ModelConfig

    from ..config import VEPOConfig
    from ..perturb import PERTURBATIONS
    from ..rewards import REWARD_FUNCS
    from ..scoring import SELECTION_STRATEGIES
    from ..train import VEPOScriptArguments
    from ..validation import rules_for, save_type_rules, settings_reads, unread_settings

    classes = (VEPOScriptArguments, VEPOConfig, ModelConfig)

    def declared() -> dict:  # only where the cache does not hold them yet
        fields = {f.name: f for cls in classes for f in dataclasses.fields(cls) if f.init}
        deciders = {name for reads in settings_reads().values() for name in reads.deciders}
        defaults = {}
        for name in deciders & set(fields):
            field = fields[name]
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            defaults[name] = getattr(default, "value", default)
        unread = {
            f"{strategy}|{perturbation}|{annealing}": unread_settings(
                SimpleNamespace(selection_strategy=strategy, perturbation=perturbation, noise_annealing=annealing)
            )
            for strategy in SELECTION_STRATEGIES
            for perturbation in PERTURBATIONS
            for annealing in (True, False)
        }
        return {"options": sorted(fields), "defaults": defaults, "unread": unread, "rewards": sorted(REWARD_FUNCS)}

    save_type_rules(rules_for(*classes), declared)


def _run(command: str, args) -> object:
    from ..run_summary import write_run_report
    from ..train import main

    script_args, training_args, model_args = args
    # transformers warns at every checkpoint about its own renamed attribute; nothing the user can act on
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    start = time.perf_counter()
    try:
        # An earlier run's report in output_dir stays until this run writes its own (plan_run says so in a line)
        trainer = main(script_args, training_args, model_args, quiet=True)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the CLI's door says it, with what is on disk
        stop.kept = _kept(training_args)
        raise
    if trainer is None:  # the folder's run had already finished: its line is printed, nothing was written
        return None
    if trainer.accelerator.is_main_process:
        print(write_run_report(trainer, time.perf_counter() - start, command))
    # Every process leaves together, its process group ended: a rank that exits while another still writes kills
    # gloo's threads mid-flight ("terminate called without an active exception", SIGABRT, exit 1 after a whole run)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return trainer


def _kept(training_args) -> str:
    """What an interrupted run left on disk and how to go on, for the one line the CLI prints."""
    from ..run_folder import last_checkpoint

    output_dir = Path(training_args.output_dir)
    checkpoint = last_checkpoint(output_dir)
    strategy = training_args.save_strategy
    if checkpoint:
        return f"{checkpoint} is saved; rerun the same command to resume from it (it says so when it does)"
    return (
        f"no checkpoint of this run was saved (save_strategy {getattr(strategy, 'value', strategy)}), and what an "
        f"earlier run left in {output_dir} is unchanged; rerun to start again (--save_strategy steps --save_steps N "
        "saves checkpoints to resume from)"
    )


def main(argv: list[str]):
    return _run("train", _parse("train", argv))
