"""JSON schemas the tests share: the structured-output ones (nested objects, enums, arrays,
integers), a tool's, and the request bodies of the server's own OpenAPI document."""


def body_schema(openapi: dict, path: str) -> dict:
    """The JSON Schema (2020-12) of `path`'s POST body in an OpenAPI 3.1 document, with the
    components its references point into."""
    ref = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": openapi["components"]}


PERSON = {  # nested object, bounded string, integer range
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "address"],
}
PETS = {  # enum and array
    "type": "object",
    "properties": {
        "pets": {
            "type": "array",
            "items": {"type": "string", "enum": ["cat", "dog", "fish"]},
            "minItems": 1,
            "maxItems": 3,
        },
        "size": {"enum": ["small", "large"]},
    },
    "required": ["pets", "size"],
}
COUNTS = {  # integers only, in an array of objects
    "type": "object",
    "properties": {
        "counts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["n"],
            },
            "maxItems": 2,
        }
    },
    "required": ["counts"],
}

# a tool the model is asked to call (its arguments are validated against `parameters`)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },  # fmt: skip
            "required": ["city", "unit"],
        },
    },
}
