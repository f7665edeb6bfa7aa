"""HTTP routes of the batch API: /v1/files (upload, list, retrieve, content, delete) and /v1/batches.

Files and batches live in Redis (batches/files.py, batches/store.py), so any gateway answers for any of
them. With API keys, each file and batch belongs to the key that made it: another key gets a 404 for it
and does not see it in lists (without keys, everything is everyone's). Creating a batch validates its input file (batches/input.py: a bad file is a 400 naming the line)
and enqueues one rq job that `llmfleet batch-runner` executes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from batches import objects
from batches.files import FileStore, file_not_found
from batches.input import URLS, parse_input
from batches.queue import enqueue_batch
from batches.redis_clients import sync_client
from batches.store import BatchStore
from gateway.http.api_keys import current_key
from gateway.http.fields import integer, invalid, metadata, parse_json_object, string
from gateway.http.redis_errors import redis_unavailable
from shared.errors import BodyTooLarge, InvalidRequest, LLMFleetError, NotFound
from shared.settings import Settings

log = logging.getLogger(__name__)

PURPOSES = ("batch",)
UPLOAD_OVERHEAD_BYTES = 64 * 1024  # multipart framing and the small fields around an uploaded file
UPLOAD_PATHS = frozenset({"/v1/files", "/files"})
Endpoint = Callable[[Request], Awaitable[Response]]


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _files(request: Request) -> FileStore:
    return FileStore(request.app.state.broker.redis)


def _batches(request: Request) -> BatchStore:
    return BatchStore(request.app.state.broker.redis)


def _owner(*, creating: bool = False) -> str | None:
    """The API key's name the request acts for: what a new object is stamped with, what reads are held to
    (None: no keys are configured, every object is visible)."""
    key = current_key.get()
    if key is None:
        return "" if creating else None
    return key.name


def _rq_connection(request: Request) -> redis.Redis:
    """The synchronous Redis client rq enqueues with (made on first use; bounded sockets, as the runners')."""
    state = request.app.state
    if getattr(state, "rq_redis", None) is None:
        state.rq_redis = sync_client(_settings(request).redis_target)
    return state.rq_redis


async def upload_file(request: Request) -> Response:
    """POST /v1/files: multipart `file` and `purpose` ("batch")."""
    settings = _settings(request)
    async with request.form(max_files=1, max_fields=8) as form:
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str):
            raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose")
        if purpose not in PURPOSES:
            raise invalid("purpose", f"{purpose!r} is not supported; use one of {', '.join(PURPOSES)}.")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("Missing required parameter: 'file' (send it as a multipart file).", param="file")
        data = await upload.read(settings.max_file_bytes + 1)
        filename = upload.filename or "upload.jsonl"
    if len(data) > settings.max_file_bytes:
        raise BodyTooLarge(f"The file is larger than the limit of {settings.max_file_bytes} bytes.")
    if not data:
        raise invalid("file", "the file is empty.")
    if purpose == "batch":  # the cheap checks now (as OpenAI does); each line is checked when a batch uses it
        await asyncio.to_thread(_check_batch_file, data, settings)
    with redis_unavailable(settings.retry_after_s):
        item = await _files(request).create(filename, purpose, data, owner=_owner(creating=True))
    log.info("file %s stored: %d bytes, purpose %s", item["id"], len(data), purpose)
    return JSONResponse(item)


def _check_batch_file(data: bytes, settings: Settings) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("file", "a batch file must be UTF-8 JSONL text.") from None
    lines = sum(1 for line in text.splitlines() if line.strip())
    if lines > settings.max_batch_lines:
        raise invalid("file", f"a batch file may hold at most {settings.max_batch_lines} requests, this one has {lines}.")


async def list_files(request: Request) -> Response:
    """GET /v1/files?purpose=&limit=&after=&order="""
    query = request.query_params
    limit = _query_int(query.get("limit"), "limit", 10_000)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "expected 'asc' or 'desc'.")
    with redis_unavailable(_settings(request).retry_after_s):
        page = await _files(request).list(purpose=query.get("purpose"), limit=limit, after=query.get("after"),
                                          order=order, owner=_owner())
    return JSONResponse(page)


async def get_file(request: Request) -> Response:
    """GET /v1/files/{file_id}"""
    with redis_unavailable(_settings(request).retry_after_s):
        return JSONResponse(await _files(request).get(request.path_params["file_id"], _owner()))


async def file_content(request: Request) -> Response:
    """GET /v1/files/{file_id}/content: the file's bytes."""
    with redis_unavailable(_settings(request).retry_after_s):
        data = await _files(request).content(request.path_params["file_id"], _owner())
    return Response(data, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    """DELETE /v1/files/{file_id}"""
    with redis_unavailable(_settings(request).retry_after_s):
        return JSONResponse(await _files(request).delete(request.path_params["file_id"], _owner()))


async def create_batch(request: Request) -> Response:
    """POST /v1/batches: validate the input file, store the batch, enqueue its rq job."""
    settings = _settings(request)
    body = parse_json_object(await request.body())
    input_file_id = string(body, "input_file_id", max_len=256)
    endpoint = string(body, "endpoint", max_len=256)
    if endpoint not in URLS:
        raise invalid("endpoint", f"{endpoint!r} is not one of {', '.join(URLS)}.")
    window = string(body, "completion_window", max_len=16)
    if window not in objects.COMPLETION_WINDOW_S:
        raise invalid("completion_window", f"{window!r} is not supported; use '24h'.")
    tags = metadata(body)
    with redis_unavailable(settings.retry_after_s):
        try:
            item = await _files(request).get(input_file_id, _owner())
            data = await _files(request).content(input_file_id, _owner())
        except NotFound:
            raise file_not_found(input_file_id, "input_file_id") from None
        if item["purpose"] != "batch":
            raise invalid("input_file_id", f"file {input_file_id} has purpose {item['purpose']!r}, not 'batch'.")
        lines = await asyncio.to_thread(parse_input, data, max_lines=settings.max_batch_lines,
                                        max_body_bytes=settings.max_body_bytes)
        batch = await _batches(request).create(input_file_id=input_file_id, endpoint=endpoint,
                                               completion_window=window, metadata=tags, total=len(lines),
                                               owner=_owner(creating=True))
        await asyncio.to_thread(enqueue_batch, _rq_connection(request), batch["id"])
    log.info("batch %s created: %d requests", batch["id"], len(lines))
    return JSONResponse(batch)


async def get_batch(request: Request) -> Response:
    """GET /v1/batches/{batch_id}"""
    with redis_unavailable(_settings(request).retry_after_s):
        return JSONResponse(await _batches(request).get(request.path_params["batch_id"], _owner()))


async def list_batches(request: Request) -> Response:
    """GET /v1/batches?after=&limit= (newest first)"""
    limit = _query_int(request.query_params.get("limit"), "limit", 20)
    with redis_unavailable(_settings(request).retry_after_s):
        return JSONResponse(await _batches(request).list(limit=limit, after=request.query_params.get("after"),
                                                         owner=_owner()))


async def cancel_batch(request: Request) -> Response:
    """POST /v1/batches/{batch_id}/cancel: 'cancelling' until its runner stopped, then 'cancelled'."""
    with redis_unavailable(_settings(request).retry_after_s):
        batch = await _batches(request).cancel(request.path_params["batch_id"], _owner())
    log.info("batch %s: cancel requested (%s)", batch["id"], batch["status"])
    return JSONResponse(batch)


def _query_int(raw: str | None, name: str, default: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(name, "expected an integer.") from None
    return integer({name: value}, name, default, 1, 1 << 31)


BATCH_ROUTES = [  # (path, endpoint, method), served under /v1 and without the prefix like the others
    ("/files", upload_file, "POST"),
    ("/files", list_files, "GET"),
    ("/files/{file_id}", get_file, "GET"),
    ("/files/{file_id}", delete_file, "DELETE"),
    ("/files/{file_id}/content", file_content, "GET"),
    ("/batches", create_batch, "POST"),
    ("/batches", list_batches, "GET"),
    ("/batches/{batch_id}", get_batch, "GET"),
    ("/batches/{batch_id}/cancel", cancel_batch, "POST"),
]


class BatchesOnCluster(LLMFleetError):
    """The Files and Batches APIs on a Redis Cluster: their runner is an rq worker, and rq needs one Redis."""

    http_status = 501
    error_type = "invalid_request_error"
    error_code = "batches_unavailable"


def _refused_on_cluster(endpoint: Endpoint) -> Endpoint:
    """The endpoint, answering 501 when the gateway runs on a Redis Cluster (REDIS_CLUSTER=1)."""
    async def guarded(request: Request) -> Response:
        """The endpoint, unless REDIS_CLUSTER is set."""
        if _settings(request).redis_cluster:
            raise BatchesOnCluster("The Files and Batches APIs are not available on a Redis Cluster "
                                   "(REDIS_CLUSTER=1): the batch runner needs a single Redis (rq).")
        return await endpoint(request)
    return guarded


ROUTES = [Route(prefix + path, _refused_on_cluster(endpoint), methods=[method]) for prefix in ("/v1", "")
          for path, endpoint, method in BATCH_ROUTES]  # gateway/app.py mounts them after OpenAI's
