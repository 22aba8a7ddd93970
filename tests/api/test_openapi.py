"""The admin API's request bodies in /openapi.json come from the attrs classes they are parsed
into, so the document cannot drift from what the admin API accepts."""

from __future__ import annotations

from typing import Any

from llmgw.admin.api import ADMIN_PREFIX
from llmgw.admin.schemas import KeyCreate, Rotate
from llmgw.api.openapi import attrs_schema, build_document
from llmgw.app import create_app
from llmgw.config import Settings, venice_provider
from llmgw.storage import api_keys


def _document() -> dict[str, Any]:
    settings = Settings(
        environment_provider=venice_provider("unused"), admin_token="openapi-admin-token"
    )
    return build_document(create_app(settings, database_url="postgresql://unused"))


def test_an_attrs_class_gives_the_body_schema() -> None:
    schema = attrs_schema(KeyCreate)
    assert schema["required"] == ["name"]
    assert schema["additionalProperties"] is False  # the converter refuses unknown fields
    assert schema["properties"]["rate_limit_requests"] == {"type": "integer"}
    assert schema["properties"]["allowed_models"] == {
        "type": "array",
        "items": {"type": "string"},
    }
    assert {"type": "null"} in schema["properties"]["expires_at"]["anyOf"]
    assert "required" not in attrs_schema(Rotate)  # grace_seconds has a default


def test_admin_operations_describe_their_bodies() -> None:
    document = _document()
    paths = document["paths"]
    create = paths[ADMIN_PREFIX + "/keys"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/KeyCreate"
    }
    assert document["components"]["schemas"]["KeyCreate"] == attrs_schema(KeyCreate)
    assert "201" in create["responses"]
    change = paths[ADMIN_PREFIX + "/keys/{key_id}"]["patch"]["requestBody"]
    changeable = change["content"]["application/json"]["schema"]
    assert set(changeable["properties"]) == set(api_keys.MUTABLE_FIELDS)
    assert "required" not in changeable
    rotate = paths[ADMIN_PREFIX + "/keys/{key_id}/rotate"]["post"]["requestBody"]
    assert rotate["required"] is False  # an empty body rotates with no grace
    assert paths[ADMIN_PREFIX + "/keys"]["get"]["security"] == [{"bearer": []}]


def test_the_operations_the_response_cache_answers_say_its_headers() -> None:
    paths = _document()["paths"]
    cached = {
        path
        for path, methods in paths.items()
        for operation in methods.values()
        if "Cache-Control" in {p["name"] for p in operation["parameters"]}
    }
    assert cached == {"/v1/chat/completions", "/v1/embeddings", "/v1/messages", "/v1/responses"}
    chat = paths["/v1/chat/completions"]["post"]
    assert "X-LLMGW-Cache-TTL" in {p["name"] for p in chat["parameters"]}
    headers = chat["responses"]["200"]["headers"]
    assert headers["X-LLMGW-Cache"]["schema"]["enum"] == ["hit", "miss", "bypass"]
    assert "Age" in headers
    assert "headers" not in paths["/v1/models"]["get"]["responses"]["200"]
