"""The composition root: the only package that sees a `RunConfig` (with `jaxagent.launch`).

It builds model, tokenizer, environments, engine and trainer from the run's config and runs the
job (`run_job`: sft, rl, sft+rl, eval). Everything below it (`models`, `text`, `envs`, `rollout`,
`credit`, `train`, `eval`) is library code configured by its own small settings types.
"""

from jaxagent.jobs.build import (Run, build_env, build_model, build_tokenizer, episode_config, model_config,
                                 param_count, prepare, sampling_params, step_key, step_rng, tokenizer_path)
from jaxagent.jobs.evaluate import run_eval, run_host_eval
from jaxagent.jobs.phases import run_rl, run_sft, sft_batch, sft_data, sft_optim
from jaxagent.jobs.run import attribution, run_job
from jaxagent.jobs.runlog import RunLog

__all__ = ["Run", "RunLog", "attribution", "build_env", "build_model", "build_tokenizer", "episode_config",
           "model_config", "param_count", "prepare", "run_eval", "run_host_eval", "run_job", "run_rl", "run_sft",
           "sampling_params", "sft_batch", "sft_data", "sft_optim", "step_key", "step_rng", "tokenizer_path"]
