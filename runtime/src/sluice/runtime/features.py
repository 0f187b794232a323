"""Names of the optional scheduler features the API layer checks before accepting a request.

The scheduler lists the ones it implements in `SchedulerReady.features`; the API refuses a
request that needs an unlisted one with a 400 "not supported yet" naming the field, so no
field is ever accepted and ignored. Plain strings, no imports: the scheduler, the API and
tests share them.
"""

CONSTRAINED = "constrained"  # SamplingParams.constraint: grammar bitmask in the sampler
TOP_LOGPROBS = "top_logprobs"  # SamplingParams.top_logprobs_num > 0
PROMPT_LOGPROBS = "prompt_logprobs"  # SamplingParams.logprob_start_len >= 0
# BatchTokenIDOut.spaces_between_special_tokens filled from SamplingParams
SPACES_BETWEEN_SPECIAL_TOKENS = "spaces_between_special_tokens"

ALL = frozenset({CONSTRAINED, TOP_LOGPROBS, PROMPT_LOGPROBS, SPACES_BETWEEN_SPECIAL_TOKENS})
