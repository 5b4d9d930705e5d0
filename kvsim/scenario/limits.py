"""The bounds that keep a run inside one machine, whatever a scenario, model config or trace says.

Each bound is far above any real deployment and far below what would exhaust memory or overflow a
64-bit number; the schema, the model-config and calibration readers and the trace parsers reject a
value outside it with one line naming the key (or the trace line) and the bound.
"""

MAX_TOKENS = 2**31  # any token count: a prompt, an output, a shared prefix, a trace row's lengths
MAX_MODEL_LEN = 2**24  # max_model_len and max_position_embeddings (10M-token-context models exist);
#                        a trace row's prompt is expanded into token ids only up to this (4 B a token)
MAX_REQUESTS = 10_000_000  # requests in one run, rows in one trace (~0.1 KB of results each)
MAX_TRACE_BLOCK_IDS = 2**27  # Mooncake hash ids in one trace (8 B each)
MAX_PREFIX_TOKENS = 2**28  # num_groups × prefix_len: every group's prefix tokens, 4 B each
MAX_PREFIX_GROUPS = 65536
MAX_REPLICAS = 4096
MAX_TENSOR_PARALLEL = 1024
MAX_NUM_SEQS = 2**20
MAX_BATCHED_TOKENS = 2**24
MAX_KV_BLOCKS = 2**27  # KV blocks over all replicas: the allocators keep ~20 B of state per block
MAX_GIB = 2.0**20  # any memory size in GiB (a pebibyte)
MAX_DURATION_S = 1e9  # simulated seconds (31 years)
MIN_RATE, MAX_RATE = 1e-6, 1e6  # requests per second
MIN_SCALE, MAX_SCALE = 1e-6, 1e6  # trace time_scale
MIN_CV, MAX_CV = 0.01, 100.0  # gamma arrivals: shape 1/cv² stays in [1e-4, 1e4]
MIN_SIGMA, MAX_SIGMA = 1e-3, 10.0  # lognormal sigma
MIN_INTERVAL_S = 1e-3  # time-series sampling interval
MAX_MS = 1e9  # SLO bounds in milliseconds (11 days)
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = 0.01, 1e6  # HBM, NVLink, PCIe: GB/s (divisors of step time)
MIN_TFLOPS, MAX_TFLOPS = 0.01, 1e6  # dense TFLOP/s (divisors of step time)
MAX_SEED = 2**63 - 1
MAX_TRACE_SECONDS = 1e11  # |arrival| in a trace (seconds; Unix times are ~1.7e9)
MIN_TRACE_YEAR, MAX_TRACE_YEAR = 1900, 2200  # wall-clock trace timestamps (numpy ns covers 1678-2262)
MAX_NAME_CHARS = 100  # scenario, policy, model and GPU names
MAX_PATH_CHARS = 4096
MAX_TEXT_CHARS = 10_000  # a scenario's description
MAX_SEEDS = 1000  # seeds per searched rate (kvsim plan --seeds)
MIN_RESOLUTION = 1e-4  # relative rate resolution of a capacity search (bisection steps stay finite)
MAX_WORKERS = 256  # local worker processes (each holds a copy of kvsim)
MAX_POINTS = 10_000  # points of one sweep (each a validated scenario, simulated in full)
MAX_CONCURRENCY = 2**20  # clients of a closed loop (workload.max_concurrency)
MAX_TURNS = 100_000  # turns of one session
MAX_SPEC_TOKENS = 16  # draft tokens a step (speculative.num_speculative_tokens; vLLM's EAGLE runs up to ~10)
MAX_WATTS = 20_000.0  # a GPU's (or its host share's) power in watts
MAX_USD_PER_KWH = 10.0
