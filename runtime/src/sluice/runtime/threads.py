"""Who gets the CPU cores: the model worker, not the processes around it.

The scheduler process runs the model with torch's intra-op pool over every core (or
`--torch-threads`). The API server (tokenizer) and the detokenizer only tokenize, detokenize
and move messages; a second thread pool in either (torch's, or the tokenizers library's
Rayon pool) would only wake up to compete with the model's threads, and one preempted model
thread stalls the whole parallel region. So both keep to one thread.
"""

from __future__ import annotations

import os
import sys


def limit_helper_process_threads() -> None:
    """Call at the start of a process that serves the model worker but does not run it."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "torch" in sys.modules:  # never import torch just to configure it
        import torch

        torch.set_num_threads(1)
