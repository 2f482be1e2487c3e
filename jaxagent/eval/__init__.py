"""Evaluation statistics (host code, numpy only): paired bootstrap intervals for comparing runs."""

from jaxagent.eval.stats import bca_interval, jackknife_acceleration, paired_bca, percentile_interval

__all__ = ["bca_interval", "jackknife_acceleration", "paired_bca", "percentile_interval"]
