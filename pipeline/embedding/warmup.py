"""Dask worker preload: import the heavy libraries while the worker starts.

Local clusters start while the Prefect API boots, so these imports (several
seconds on a small machine) overlap with it instead of delaying the first shard:
torch and transformers for the model, Prefect's task engine for running the tasks,
and the library steps the tasks call. The orchestration layer (``flows``) is not
imported here: the library never imports it; the worker loads it when it unpickles a task.
sentence-transformers is imported only for a model whose modules the embedder does
not run itself (``pipeline.embedding.pooling.native_st_pooling``).
"""

import prefect.task_engine  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401
import transformers.modeling_utils  # noqa: F401 - transformers is lazy: this is the costly part
from transformers import AutoModel, AutoTokenizer  # noqa: F401

import pipeline.audit.steps  # noqa: F401
import pipeline.embedding.embed  # noqa: F401

# A weight-loading progress bar per worker is noise in an audit's output.
transformers.utils.logging.disable_progress_bar()
