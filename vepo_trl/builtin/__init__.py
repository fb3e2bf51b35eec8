"""The built-in models and data that stand in for real ones, below the trainer: the tiny model of every family
(`tiny_models`, the demo's and the tests' `tiny-<family>`), the lab's tasks (`lab_tasks`) and its SFT'd warm start
(`warm_start`). `local_models` resolves the names that stand for them (`tiny-qwen2.5-vl`, `lab-warm-start`); the
applications (`lab`, `commands`) and the trainer's entry point read them from here, and nothing here imports them.
"""
