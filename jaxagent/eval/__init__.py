"""Evaluation beside training (host code): policy evaluations on held-out tasks (`rollouts`),
run reports, diagnostics and plots (`report`), and paired bootstrap statistics (`stats`)."""

from jaxagent.eval.stats import (bca_interval, jackknife_acceleration, paired_bca, paired_bootstrap,
                                 percentile_interval, steps_to_threshold)

__all__ = ["bca_interval", "jackknife_acceleration", "paired_bca", "paired_bootstrap", "percentile_interval",
           "steps_to_threshold"]
