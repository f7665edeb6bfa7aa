"""Every Redis key, stream, field and channel name used by llmfleet, all under one prefix.

Redis Cluster: every name built from a model starts with llmfleet:{{model}} (`model_tag`): the model's name in
literal braces, a hash tag, so all of one model's keys and channels hash to one slot and the scripts and
MULTI/EXEC over several of them (fair queue, placement, stealing) never cross slots. The per-request names (events,
journal, owner, cancelled) carry the tag of the request's model (the job's `model`: the base model, whose job streams
hold it), so the worker's fencing scripts (owner + journal + events channel + job stream) and one turn's MULTI/EXEC
of all a worker's requests stay in its model's slot. Names without a model are used by themselves (one key per
command) or are global indexes. Changing a name is a wire-contract change: every process upgrades together.

Layout (values in brackets are what is stored there; {{model}} is the model's name inside literal braces):
  llmfleet:{{model}}:jobs        stream [field "job" = codec bytes of a GenerateJob / EmbedJob] of the normal
                                 class; llmfleet:{{model}}:jobs@{priority} the same for critical, high and low;
                                 consumer group JOBS_GROUP, created at id 0 with MKSTREAM by whoever
                                 comes first (gateway or worker), BUSYGROUP ignored
  llmfleet:{{model}}:jobs@w:{worker_id}@{priority}  stream, same fields and group: jobs the gateway placed on
                                 one worker (prefix-aware placement, gateway/cluster/placement.py); its worker reads it
                                 before the shared stream of the same class, idle workers steal from it when it
                                 lags, and the others drain it once the worker is dead
  llmfleet:{{model}}:fair@{priority}  sorted set request id -> virtual start tag: the class's jobs waiting for their
                                 tenant's fair share (shared/fair_queue.py FAIR_SCRIPT); their codec bytes in
                                 hash llmfleet:{{model}}:fair-jobs@{priority}, the virtual time and each tenant's
                                 finish tag in hash llmfleet:{{model}}:fair-state@{priority}; all three deleted when
                                 the queue empties, EXPIRE the latest job's deadline
  llmfleet:{{model}}:placed      set of worker ids that have (or had) per-worker streams of the model; the gateway
                                 adds the id with every placed job, a worker at start; a dead worker's id is
                                 removed (with its streams) once they are empty and nothing is pending
  llmfleet:{{model}}:prefix:{hash}  string worker_id (+ "\x1f" + its host KV tier, if any), EX LLMFLEET_PREFIX_TTL_S:
                                 the worker that last got a request whose prompt starts with the chunks that `hash`
                                 chains (written by the gateway)
  llmfleet:{{model}}:events:{request_id}  pub/sub channel [codec bytes of one event]; worker publishes, the
                                 gateway that submitted the request listens (sharded pub/sub on a Redis Cluster)
  llmfleet:{{model}}:journal:{request_id}  stream [fields "seq" = decimal seq, "event" = codec bytes]; every event
                                 is appended here BEFORE it is published (same MULTI/EXEC)
  llmfleet:{{model}}:cancel      pub/sub channel [codec bytes of a CancelRequest]; gateways publish,
                                 every worker of the model listens
  llmfleet:{{model}}:cancelled:{request_id}  string "1" with a TTL; set with every cancel so a worker that takes
                                 the job later (or missed the publish) still sees it
  llmfleet:{{model}}:owner:{request_id}  string "<epoch>:<worker_id>" (then "done"), TTL request timeout + 60 s: the
                                 fence of the request's journal, channel and ack (worker/failover/fencing.py)
  llmfleet:{{model}}:deadletter  stream [fields "job" = codec bytes, "worker", "deliveries", "at"]; jobs
                                 delivered LLMFLEET_MAX_DELIVERIES times without an ack, set aside
  llmfleet:worker:{worker_id}    hash, the worker's registry entry, EXPIRE heartbeat TTL
  llmfleet:{{model}}:kv-tier-drop  integer, INCR'd by POST /admin/kv-tier/drop; every worker of the model GETs it with
                                 each heartbeat and, when it grew, empties its host's KV tier file of the model
  llmfleet:workers               sorted set worker_id -> last heartbeat (unix s)
  llmfleet:models                sorted set model -> last heartbeat of any worker serving it (unix s)
  llmfleet:supervisor:{name}     hash [workers_expected, workers_running, workers_given_up, restarts]
                                 written by `llmfleet serve` every poll, EXPIRE 10 s; read by /ready
  llmfleet:errors                list [JSON entries: time, model, status, type, code, param, request_id,
                                 key name, path, streamed; never a message or request content], newest
                                 first, LTRIM'd to 100; every gateway writes it, /dashboard/fleet.json reads it
  llmfleet:file:{file_id}        hash [id, filename, purpose, bytes, created_at, data = the file's bytes]
  llmfleet:files                 sorted set file_id -> created_at (unix s, float)
  llmfleet:batch:{batch_id}      hash: the batch object's fields (batches/objects.py), counts as integers
  llmfleet:batches               sorted set batch_id -> created_at; llmfleet:batches:active: set of the
                                 batch ids not yet in a terminal state (what a runner may have to resume)
  llmfleet:batch:{id}:output     hash line index -> output JSONL line; llmfleet:batch:{id}:errors the same
                                 for failed lines; both deleted once the batch's files are written
  llmfleet:batch:{id}:lease      string runner id, PX LLMFLEET_BATCH_LEASE_S: the runner executing it
  llmfleet:{{model}}:loras       hash adapter name -> JSON {"source": path or hf: name, "added": unix s}: the
                                 LoRA adapters every worker of the model should hold (POST/DELETE /admin/loras)
  llmfleet:{{model}}:loras-version  integer, INCR with each write of that hash; workers report the one they follow
  llmfleet:{{model}}:lora-errors  hash adapter name -> the load error a worker hit (the name was dropped from
                                 the desired set); cleared by the next POST of that name
  llmfleet:model-facts           hash model -> JSON facts of its GGUF file (size, sha256 digest, details), written
                                 by its workers' heartbeats and node agents (worker/model_facts.py)
  llmfleet:nodes                 sorted set node_id -> last heartbeat of that node agent (unix s)
  llmfleet:node:{node_id}        hash, a node agent's state (shared/warm_pool.py NodeState), EXPIRE node TTL
  llmfleet:{{model}}:pool:loading  string node_id, PX 10 s renewed while loading: the one node loading it now
                                 (SET NX: two nodes never both load what one load satisfies)
  llmfleet:{{model}}:pool:failed  string [the load error's message], EX LLMFLEET_POOL_FAILURE_TTL_S
  llmfleet:pool:commands         stream [fields "op" = load/unload, "model", "force" = 0/1]; every node
                                 XREADs it (no group), MAXLEN ~ 1000
  llmfleet:pool:used             sorted set model -> last time a gateway admitted a request for it
  llmfleet:pool:keep_alive       hash model -> keep-alive seconds of its latest request (-1 = forever)
  llmfleet:response:{resp_id}    string [JSON: a stored Responses API response, its history, request id, model,
                                 API key name, deadline], EX LLMFLEET_RESPONSES_TTL_S (gateway/responses_api/store.py)
  llmfleet:ratelimit:{key_name}:{kind}  string [GCRA's theoretical arrival time], PX until it no longer
                                 limits: one API key's request or token limit, shared by every gateway
  llmfleet:gateways              sorted set gateway_id -> last heartbeat (unix s): the gateways alive
  llmfleet:{streams}:gateway-streams:{gateway_id}  set of the resumable stream ids a gateway serves (or runs in background)
  llmfleet:{streams}:stream:{stream_id}  hash [record = JSON: API, request body, request and job ids, model, created,
                                 deadline, key name; owner = gateway id, "" (nobody listens), "done" or
                                 "cancelled"; background = 1 for a background response], EXPIRE the deadline +
                                 retention, then LLMFLEET_STREAM_RETENTION_S once it ended (gateway/cluster/streams.py)
  llmfleet:{streams}:orphans     sorted set stream_id -> when its jobs are cancelled unless a client resumes it
  rq:queue:llmfleet-batches      rq's own keys (rq:job:*, rq:worker:*, ...): one rq job per batch, JSON
"""

from __future__ import annotations

from shared.messages import PRIORITIES_HIGH_TO_LOW

PREFIX = "llmfleet:"

JOBS_GROUP = "workers"
JOB_FIELD = "job"
TENANT_FIELD = "tenant"  # beside `job` in an entry a fair queue wrote: whose share it counts against
JOURNAL_SEQ_FIELD = "seq"
JOURNAL_EVENT_FIELD = "event"
WORKERS_INDEX = f"{PREFIX}workers"
MODELS_INDEX = f"{PREFIX}models"
ERRORS_LIST = f"{PREFIX}errors"
GATEWAYS_INDEX = f"{PREFIX}gateways"
# The resumable streams' names share one hash tag: a change of a stream's owner is one WATCH/MULTI over its record,
# the orphans set and a gateway's set (gateway/cluster/streams.py), so on a Redis Cluster they live in one slot (one
# node carries every stream record: a few writes per streamed request, never per token). No model's key ends in
# these suffixes, so a model named "streams" shares only the slot.
STREAMS_TAG = f"{PREFIX}{{streams}}"
ORPHANS = f"{STREAMS_TAG}:orphans"


PRIORITY_ORDER = PRIORITIES_HIGH_TO_LOW  # the order workers read a model's job streams in (shared/messages.py owns it)


def model_tag(model: str) -> str:
    """The start of every key named after one model: "llmfleet:{<model>}", whose braces are a Redis Cluster hash tag,
    so all of them (and the scripts and transactions over several) live in one slot."""
    return f"{PREFIX}{{{model}}}"


def jobs_stream(model: str, priority: str = "normal") -> str:
    """The job stream of one model and priority class (the normal class keeps the plain name)."""
    if priority == "normal":
        return f"{model_tag(model)}:jobs"
    return f"{model_tag(model)}:jobs@{priority}"


def jobs_streams(model: str) -> list[str]:
    """Every job stream of one model, highest priority first."""
    return [jobs_stream(model, priority) for priority in PRIORITY_ORDER]


def worker_jobs_stream(model: str, worker_id: str, priority: str = "normal") -> str:
    """The stream of one priority class of the jobs placed on one worker."""
    return f"{model_tag(model)}:jobs@w:{worker_id}@{priority}"


def worker_jobs_streams(model: str, worker_id: str) -> list[str]:
    """Every per-worker job stream of one worker and model, highest priority first."""
    return [worker_jobs_stream(model, worker_id, priority) for priority in PRIORITY_ORDER]


def fair_keys(model: str, priority: str = "normal") -> list[str]:
    """One class's fair queue, its jobs, its state and the shared stream it releases into (FAIR_SCRIPT's KEYS)."""
    tag = model_tag(model)
    return [f"{tag}:fair@{priority}", f"{tag}:fair-jobs@{priority}", f"{tag}:fair-state@{priority}",
            jobs_stream(model, priority)]


def fair_lane_keys(model: str, priority: str = "normal") -> list[str]:
    """One class's untaken counts per tenant and the stream its newcomers go to, the class above's shared stream
    (the class's own at the top: no lane there); FAIR_SCRIPT's KEYS[5] and KEYS[6] (shared/fair_queue.py)."""
    rank = PRIORITY_ORDER.index(priority) if priority in PRIORITY_ORDER else 0  # an unknown class: no lane
    above = PRIORITY_ORDER[max(0, rank - 1)] if rank else priority
    return [f"{model_tag(model)}:fair-untaken@{priority}", jobs_stream(model, above)]


def placed_workers(model: str) -> str:
    """The set of worker ids with per-worker job streams of one model."""
    return f"{model_tag(model)}:placed"


def prefix_owner(model: str, prefix_hash: str) -> str:
    """Which worker last got a prompt starting with the chunks one prefix hash chains."""
    return f"{model_tag(model)}:prefix:{prefix_hash}"


def events_channel(model: str, request_id: str) -> str:
    """The pub/sub channel carrying one request's events (`model`: the job's base model, as its job stream's)."""
    return f"{model_tag(model)}:events:{request_id}"


def journal_stream(model: str, request_id: str) -> str:
    """The capped stream keeping the events already published for one request."""
    return f"{model_tag(model)}:journal:{request_id}"


def stream_record(stream_id: str) -> str:
    """The hash of one resumable stream: what it renders and who listens (gateway/cluster/streams.py)."""
    return f"{STREAMS_TAG}:stream:{stream_id}"


def gateway_streams(gateway_id: str) -> str:
    """The set of the resumable streams one gateway serves."""
    return f"{STREAMS_TAG}:gateway-streams:{gateway_id}"


def cancel_channel(model: str) -> str:
    """The pub/sub channel on which cancels of one model's requests are announced."""
    return f"{model_tag(model)}:cancel"


def cancelled_marker(model: str, request_id: str) -> str:
    """The key that marks one request as cancelled."""
    return f"{model_tag(model)}:cancelled:{request_id}"


def worker_key(worker_id: str) -> str:
    """The registry hash of one worker."""
    return f"{PREFIX}worker:{worker_id}"


def supervisor_status(name: str) -> str:
    """Hash: what one `llmfleet serve` supervises (workers expected, running, given up); TTL-refreshed."""
    return f"{PREFIX}supervisor:{name}"


def owner_key(model: str, request_id: str) -> str:
    """Who may write one request's events now ("<epoch>:<worker_id>", or "done")."""
    return f"{model_tag(model)}:owner:{request_id}"


def deadletter_stream(model: str) -> str:
    """The stream where one model's poison jobs are set aside."""
    return f"{model_tag(model)}:deadletter"


FILES_INDEX = f"{PREFIX}files"
BATCHES_INDEX = f"{PREFIX}batches"
BATCHES_ACTIVE = f"{PREFIX}batches:active"
BATCH_QUEUE = "llmfleet-batches"  # the rq queue (rq adds its own "rq:" prefix)


def file_key(file_id: str) -> str:
    """The hash of one uploaded or generated file (metadata and bytes)."""
    return f"{PREFIX}file:{file_id}"


def batch_key(batch_id: str) -> str:
    """The hash holding one batch's fields and request counts."""
    return f"{PREFIX}batch:{batch_id}"


def batch_output(batch_id: str) -> str:
    """The hash of a batch's finished lines (line index -> output JSONL line)."""
    return f"{PREFIX}batch:{batch_id}:output"


def batch_errors(batch_id: str) -> str:
    """The hash of a batch's failed lines (line index -> error JSONL line)."""
    return f"{PREFIX}batch:{batch_id}:errors"


def batch_lease(batch_id: str) -> str:
    """Which batch runner is executing a batch right now (expires unless renewed)."""
    return f"{PREFIX}batch:{batch_id}:lease"


def response_key(response_id: str) -> str:
    """The stored Responses API response `resp_...` (gateways only)."""
    return f"{PREFIX}response:{response_id}"


def kv_tier_drop(model: str) -> str:
    """The counter of a model's host-tier drops (INCR by the admin route; workers empty their tier when it grows)."""
    return f"{model_tag(model)}:kv-tier-drop"


def loras_desired(model: str) -> str:
    """The hash of LoRA adapters every worker of a model should have loaded (name -> JSON source)."""
    return f"{model_tag(model)}:loras"


def loras_version(model: str) -> str:
    """The counter of a model's desired-set changes (INCR with each write; workers report the one they follow)."""
    return f"{model_tag(model)}:loras-version"


def loras_errors(model: str) -> str:
    """The hash of adapter load errors of a model's workers (name -> message)."""
    return f"{model_tag(model)}:lora-errors"
MODEL_FACTS = f"{PREFIX}model-facts"  # hash: model -> JSON of its file's size, digest, details (worker/model_facts.py)
NODES_INDEX = f"{PREFIX}nodes"
POOL_COMMANDS = f"{PREFIX}pool:commands"
POOL_USED = f"{PREFIX}pool:used"
POOL_KEEP_ALIVE = f"{PREFIX}pool:keep_alive"


def node_key(node_id: str) -> str:
    """The state hash of one node agent (its catalogue, capacity and loaded models)."""
    return f"{PREFIX}node:{node_id}"


def pool_loading(model: str) -> str:
    """The claim of the one node loading `model` right now (SET NX with a TTL)."""
    return f"{model_tag(model)}:pool:loading"


def rate_limit_key(key_name: str, kind: str) -> str:
    """One API key's limit state (GCRA, gateway/http/rate_limit.py) for `kind` "requests" or "tokens"."""
    return f"{PREFIX}ratelimit:{key_name}:{kind}"


def pool_failed(model: str) -> str:
    """The remembered error of `model`'s last failed load (expires: no load storm, then a new try)."""
    return f"{model_tag(model)}:pool:failed"
