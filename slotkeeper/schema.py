"""OpenAPI details drf-spectacular cannot infer: our Bearer token scheme, the error answers, strict bodies."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from rest_framework.serializers import ListSerializer

from slotkeeper.fields import ID_PATH, INT64_MAX


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "slotkeeper.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A person's or integration's token (`manage.py issue_token`), or a node agent's token "
            "(returned once by POST /api/nodes/) for that node's heartbeat and assignments.",
        }


# The error answers every operation can give, documented once here rather than on each view (slotkeeper/api.py
# makes them). Without them the schema said an operation answers only 200, and a client generated from it had no
# type for the 400 that names the bad field.
ERROR_COMPONENTS = {
    "Error": {
        "type": "object",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
        "description": "What went wrong, for a person. A 409 may add context (e.g. `lease`, `verdicts`).",
    },
    "ValidationError": {
        "type": "object",
        "additionalProperties": {},
        "description": "Bad input: each offending field (nested fields nested) with its messages, or `detail` "
        "when the body itself could not be read.",
    },
}
ERROR_DESCRIPTIONS = {
    "400": ("ValidationError", "bad input: the fields named, nothing changed"),
    "401": ("Error", "no or an unknown token"),
    "403": ("Error", "the token's role (or node) may not do this"),
    "404": ("Error", "no such object"),
    "409": ("Error", "conflicts with the current state; nothing changed"),
    "413": ("Error", "the request body is larger than the server reads"),
    "415": ("Error", "the request body is not JSON"),
    "503": (
        "Error",
        "the scheduler is busy: its plan lock was not free in time (see the Retry-After header); nothing changed, "
        "send it again",
    ),
}
WRITE_METHODS = {"post", "put", "patch", "delete"}


def error_codes(method: str, operation: dict) -> list[str]:
    codes = ["400", "401", "403"]
    if any(p.get("in") == "path" for p in operation.get("parameters", [])):
        codes.append("404")
    if method in WRITE_METHODS:
        # Every write may wait for the plan lock (or the database's write lock), and that wait is bounded.
        codes += ["409", "503"]
    if "requestBody" in operation:
        codes += ["413", "415"]
    return codes


def document_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: adds the error answers to every operation under /api/."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(ERROR_COMPONENTS)
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/api/"):
            continue
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            for code in error_codes(method, operation):
                component, description = ERROR_DESCRIPTIONS[code]
                response = responses.setdefault(code, {"description": description})
                response.setdefault("content", _json_ref(component))
            for code, response in responses.items():
                if code[0] in "45":  # an error a view documented by description alone (412, 409)
                    response.setdefault("content", _json_ref("Error"))
            operation["responses"] = dict(sorted(responses.items()))
    return result


def _json_ref(component: str) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}}


class RefusesUnknownFields(OpenApiSerializerExtension):
    """A request body read by a strict serializer (slotkeeper/serializers.py) says so: `additionalProperties: false`.
    Without it the schema let a client (or a generated one) send fields the server answers 400 to."""

    target_class = "slotkeeper.serializers.RefuseUnknownFieldsMixin"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
            # drf-spectacular leaves a nested list's bounds out (`nodes: []` was schema-valid, and a 400).
            for name, field in self.target.fields.items():
                if isinstance(field, ListSerializer) and name in schema.get("properties", {}):
                    bounds = {"minItems": 0 if field.allow_empty else 1}
                    if field.min_length is not None:
                        bounds["minItems"] = max(bounds["minItems"], field.min_length)
                    if field.max_length is not None:
                        bounds["maxItems"] = field.max_length
                    schema["properties"][name].update({k: v for k, v in bounds.items() if v})
        return schema


def integer_path_ids(result, generator, request, public):
    """drf-spectacular postprocessing hook: an id path parameter restricted to ASCII digits (`fields.ID_PATH`, a
    viewset's lookup_value_regex) stays an integer in the schema, as it was, not a string with a pattern."""
    digits = {"type": "string", "pattern": f"^{ID_PATH}$"}
    for item in result.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else ():
                if parameter.get("in") == "path" and parameter.get("schema") == digits:
                    parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
                    parameter.setdefault("description", "The object's id, in ASCII digits.")
    return result


# A string the server reads with DRF's CharField: never a NUL ("Null characters are not allowed."), and, where it
# may not be blank, not blank once trimmed (" " and "\n" are). Patterns, so that the schema refuses what the server
# refuses (Schemathesis sent both and was answered 400).
NO_NUL = "^[^\\u0000]*$"
NOT_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"


def strings_as_read(result, generator, request, public):
    """drf-spectacular postprocessing hook: every free-form string of a request body (no pattern, format or enum of
    its own) states the server's rules: no NUL, and not blank when it must not be."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            _patterned(component)
    return result


def inline_bodies_required(result, generator, request, public):
    """drf-spectacular postprocessing hook: an inline request body that names what it requires (approve-many's and
    the extension's oneOf) cannot be left out: no body is a 400, so the schema says the body is required
    (Schemathesis sent none and was refused)."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            for media in (body or {}).get("content", {}).values():
                schema = media.get("schema", {})
                if schema.get("required") or schema.get("oneOf"):
                    body["required"] = True
    return result


def _patterned(schema) -> None:
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not ({"pattern", "format", "enum"} & schema.keys()):
        schema["pattern"] = NOT_BLANK if schema.get("minLength", 0) >= 1 else NO_NUL
    for key in ("properties",):
        for child in schema.get(key, {}).values():
            _patterned(child)
    for key in ("items", "additionalProperties"):
        _patterned(schema.get(key))
    for key in ("allOf", "oneOf", "anyOf"):
        for child in schema.get(key, []):
            _patterned(child)
