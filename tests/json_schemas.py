"""JSON schemas the structured-output tests share: nested objects, enums, arrays, integers."""

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
