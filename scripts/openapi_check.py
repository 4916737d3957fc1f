"""Checks lockstep's OpenAPI document and the answers the server gave.

Reads one JSON file (argv[1]) written by tests/openapi.rs:

    {"document": <the document GET /openapi.json served>,
     "answers": [{"what": "...", "schema": "<JSON pointer into the document>",
                  "body": <the JSON body the server answered>}, ...]}

and checks that the document is valid OpenAPI 3.1 (openapi-spec-validator)
and that each body matches the schema the document gives that answer
(JSON Schema 2020-12, OpenAPI 3.1's dialect). The schemas' `$ref`s are
resolved inside the document itself. Prints every failure; exits 1 if any.
Runs in .tools/openapi/venv (scripts/openapi-tools).
"""

import json
import sys

from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        given = json.load(f)
    document = given["document"]
    failures = []
    try:
        validate(document)
    except Exception as e:  # the validator's errors share no base class
        failures.append(f"the document is not valid OpenAPI 3.1: {e}")
    for answer in given["answers"]:
        # The document as the root schema, so "#/components/..." resolves;
        # its other members are not JSON Schema keywords and are ignored.
        schema = dict(document, **{"$ref": "#" + answer["schema"]})
        validator = Draft202012Validator(schema, format_checker=FormatChecker())
        for error in validator.iter_errors(answer["body"]):
            failures.append(
                f"{answer['what']}: the body does not match {answer['schema']}: "
                f"{error.message} (at {'/'.join(map(str, error.absolute_path)) or 'the top'})\n"
                f"  body: {json.dumps(answer['body'])}"
            )
    for failure in failures:
        print(failure)
    print(f"checked the document and {len(given['answers'])} answers: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
