"""The route table: every route the application serves has its record, and /openapi.json
describes exactly those routes, each from its record."""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web

from llmgw.admin.api import ADMIN_PREFIX
from llmgw.api.openapi import build_document
from llmgw.app import create_app
from llmgw.config import Settings, venice_provider
from llmgw.route_table import CONSOLE_PREFIX, DESCRIBED, Route, admitting
from llmgw.routes import PUBLIC_PATHS, gateway_routes


def _app() -> web.Application:
    settings = Settings(
        environment_provider=venice_provider("unused"), admin_token="routes-admin-token"
    )
    return create_app(settings, database_url="postgresql://unused")


def served_routes(app: web.Application) -> Iterator[tuple[str, str, Route | None]]:
    """(method, path, record) of every API route; the console (browser pages) is not one."""
    for resource in app.router.resources():
        if resource.canonical.startswith(CONSOLE_PREFIX):
            continue
        sub_app = resource.get_info().get("app")
        if isinstance(sub_app, web.Application):
            yield from served_routes(sub_app)
            continue
        for route in resource:
            if route.method != "HEAD":
                yield route.method, resource.canonical, app[DESCRIBED].get(route.handler)


def test_every_route_has_its_operation_and_every_operation_a_route() -> None:
    app = _app()
    served = list(served_routes(app))
    assert [(method, path) for method, path, record in served if record is None] == []
    document = build_document(app)
    operations = {
        (method.upper(), path): operation
        for path, by_method in document["paths"].items()
        for method, operation in by_method.items()
    }
    assert set(operations) == {(method, path) for method, path, _ in served}
    for method, path, record in served:
        assert record is not None and record.method == method
        assert path.endswith(record.path)  # a sub-application's routes carry its prefix
        assert operations[method, path]["operationId"] == record.doc.operation_id
        assert operations[method, path]["summary"] == record.doc.summary
    assert ("POST", ADMIN_PREFIX + "/keys") in operations
    ids = [operation["operationId"] for operation in operations.values()]
    assert len(ids) == len(set(ids))


def test_a_renamed_route_keeps_its_operation() -> None:
    """The description travels with the route, not with a path string written twice."""
    app = web.Application()
    route = next(route for route in gateway_routes() if route.path == "/v1/embeddings")
    app.router.add_post("/v2/embeddings", route.handler)
    app[DESCRIBED] = {route.handler: route}
    operation = build_document(app)["paths"]["/v2/embeddings"]["post"]
    assert operation["operationId"] == "createEmbeddings"
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EmbeddingsRequest"
    }


def test_public_routes_and_those_that_admit_themselves_come_from_the_records() -> None:
    routes = gateway_routes()
    assert {"/healthz", "/readyz", "/metrics", "/openapi.json"} == PUBLIC_PATHS
    admits = {(route.method, route.path) for route in routes if route.handler in admitting(routes)}
    assert admits == {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/images/generations"),
        ("POST", "/v1/audio/speech"),
        ("POST", "/v1/audio/transcriptions"),
    }
