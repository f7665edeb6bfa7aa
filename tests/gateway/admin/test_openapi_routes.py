"""The OpenAPI document lists every public route the gateway serves (walked from the app's own routing table,
so a new route without an entry fails here), lists nothing the gateway does not serve, and every entry loads."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gateway.admin.openapi import openapi_document
from gateway.app import create_app
from shared.settings import Settings

NOT_DOCUMENTED = {  # path -> why it is left out of the document
    "/openapi.json": "the document itself",
    "/": "Ollama's plain-text banner, which clients probe",
    "/metrics": "Prometheus' text format",
    "/dashboard": "the dashboard's HTML page",
    "/dashboard/fleet.json": "the dashboard's own data",
    "/dashboard/{asset}": "the dashboard's static files",
}
METHODS = ("get", "post", "delete", "put", "patch")


def _served() -> Iterator[tuple[str, str]]:
    """(path as the document writes it, method) of every route of the app; HEAD is GET's twin."""
    for route in create_app(Settings()).routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # {model:path} -> {model}
        for method in sorted(set(route.methods or ()) - {"HEAD"}):
            yield path, method.lower()


def _documented(doc: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, item in doc["paths"].items() for method in item if method in METHODS}


def test_every_served_route_is_in_the_document() -> None:
    documented = _documented(openapi_document(Settings()))
    missing = [(path, method) for path, method in _served() if path not in NOT_DOCUMENTED
               and (path, method) not in documented and ("/v1" + path, method) not in documented]
    assert not missing, f"routes the gateway serves that /openapi.json lacks: {missing}"


def test_the_document_lists_only_served_routes() -> None:
    served = set(_served())
    extra = sorted(_documented(openapi_document(Settings())) - served)
    assert not extra, f"/openapi.json lists routes the gateway does not serve: {extra}"


def test_the_responses_routes_are_all_there() -> None:
    paths = openapi_document(Settings())["paths"]
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    listing = paths["/v1/responses/{response_id}/input_items"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"response_id", "limit", "order", "after", "before"}
    assert "post" in paths["/v1/responses/{response_id}/cancel"]


def test_every_reference_resolves_and_every_operation_loads() -> None:
    doc = openapi_document(Settings())
    names = set(doc["components"]["schemas"])
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', str(doc).replace("'", '"')))
    assert refs and refs <= names, f"unresolved: {refs - names}"
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
    loaded = list(schemathesis.openapi.from_dict(doc).get_all_operations())
    errors = [str(result.err()) for result in loaded if not hasattr(result, "ok")]  # an Err has no ok()
    assert not errors and len(loaded) == len(_documented(doc)), errors


def test_each_api_errors_in_its_own_shape() -> None:
    paths = openapi_document(Settings())["paths"]

    def error_ref(path: str, method: str) -> str:
        return paths[path][method]["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert error_ref("/v1/responses/{response_id}/input_items", "get").endswith("/Error")
    assert error_ref("/v1/messages", "post").endswith("/AnthropicError")
    assert error_ref("/api/chat", "post").endswith("/OllamaError")
