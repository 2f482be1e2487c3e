"""Experiments made of jobs: each composes run configs and launches ``job=sft`` / ``job=rl`` runs (or, for the
probe, builds one run's trainer) and reads back what they logged. The credit grid (`credit_grid`: credit
methods compared over seeds and held-out tasks, with its runs, figures and report in `grid_runs`,
`grid_figures` and `grid_report`), RL-learns (`rl_learns`: GRPO against an lr = 0 control with identical
rollouts) and the credit probe (`probe_credit`: where InfoPO's info term pushes). Their command lines are in
scripts/ (compare_credit.py, bench_rl_learns.py, probe_credit.py).
"""
