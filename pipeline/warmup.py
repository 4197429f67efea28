"""Dask worker preload: import the heavy libraries while the worker starts.

Local clusters start while the Prefect API boots, so these imports (several
seconds on a small machine) overlap with it instead of delaying the first shard:
torch, transformers and sentence-transformers for the model, Prefect's task engine
for running the tasks.
"""

import prefect.task_engine  # noqa: F401
import sentence_transformers  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

import flows.tasks  # noqa: F401
import pipeline.embed  # noqa: F401
import pipeline.steps  # noqa: F401

# A weight-loading progress bar per worker is noise in an audit's output.
transformers.utils.logging.disable_progress_bar()
