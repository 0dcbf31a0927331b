"""OpenAPI details drf-spectacular cannot infer: our Bearer token scheme."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
