"""A lab on a laptop: a warm-started tiny VLM, visual tasks that carry VEPO's mechanism, and `vepo-trl lab`.

    vepo-trl lab                      the default task's rules x seeds from its warm start, paired comparisons
    vepo-trl lab --task colour        the first lab (one square's colour)
    vepo-trl lab --sweep 1.5e-4,3e-4,6e-4 --seeds 100,101   each rule's best learning rate, on validation rows
    vepo-trl lab --quick              two short runs, for CI (under 3 minutes on 2 cores)
    vepo-trl lab --build_warm_start   only build (or find) the cached warm start

`vepo_trl.builtin.lab_tasks` renders the tasks and `vepo_trl.builtin.warm_start` builds and caches the SFT'd model
(below the trainer: the demo and `dataset_name lab` read them too); here `experiment` trains and measures, `results`
writes the tables and the plot; the command's options are `vepo_trl.commands.lab`'s.
"""
