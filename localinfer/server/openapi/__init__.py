"""The server's OpenAPI description (GET /openapi.json): schemas, operations, the document."""
