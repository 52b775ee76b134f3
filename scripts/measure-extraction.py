#!/usr/bin/env python3
"""Value accuracy of `response_format: json_schema` extraction, for comparing grammar layouts.

Usage: measure-extraction.py BASE_URL API_KEY MODEL_ID
Ten short paragraphs, each with four facts; temperature 0; prints the per-field hit count and the
total out of 40. Used for the whitespace change in crates/engine/src/constraint.rs (see
docs/tools-and-structured-output.md, "Structured output").
"""

import json
import sys

from openai import OpenAI

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "birth_year": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
    },
    "required": ["name", "birth_year", "city", "occupation"],
    "additionalProperties": False,
}

CASES = [
    ("Marta Kowalski was born in 1984 in Krakow. She works as a civil engineer designing bridges.", ("Marta Kowalski", 1984, "Krakow", "civil engineer")),
    ("Born in 1962, the pianist Henrik Dahl grew up in Bergen and still gives concerts there.", ("Henrik Dahl", 1962, "Bergen", "pianist")),
    ("Aiko Tanaka (born 1990) is a nurse at a hospital in Osaka.", ("Aiko Tanaka", 1990, "Osaka", "nurse")),
    ("The baker Luis Ortega opened his first shop in Seville. He was born in 1975.", ("Luis Ortega", 1975, "Seville", "baker")),
    ("Chloe Martin, a journalist, was born in Lyon in 1988 and writes about science.", ("Chloe Martin", 1988, "Lyon", "journalist")),
    ("In 1951 Samuel Okafor was born in Lagos; he later became a surgeon.", ("Samuel Okafor", 1951, "Lagos", "surgeon")),
    ("Priya Nair teaches mathematics in Chennai. She is a teacher born in 1979.", ("Priya Nair", 1979, "Chennai", "teacher")),
    ("The architect Jonas Weber, born in 1969, lives and works in Hamburg.", ("Jonas Weber", 1969, "Hamburg", "architect")),
    ("Elena Rossi was born in 1995 in Turin and is a software developer.", ("Elena Rossi", 1995, "Turin", "software developer")),
    ("Tom Becker, a farmer from Graz, was born in 1958.", ("Tom Becker", 1958, "Graz", "farmer")),
]
FIELDS = ["name", "birth_year", "city", "occupation"]


def norm(v):
    return v.strip().lower() if isinstance(v, str) else v


def main() -> None:
    base, key, model = sys.argv[1:4]
    client = OpenAI(base_url=base, api_key=key, max_retries=0)
    hits = {f: 0 for f in FIELDS}
    for text, expected in CASES:
        r = client.chat.completions.create(
            model=model,
            temperature=0,
            max_tokens=120,
            messages=[{"role": "user", "content": f"Extract the person's name, birth year, city and occupation as JSON.\n\n{text}"}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        )
        content = r.choices[0].message.content
        try:
            doc = json.loads(content)
        except json.JSONDecodeError:
            doc = {}
        for f, want in zip(FIELDS, expected):
            hits[f] += norm(doc.get(f)) == norm(want)
        print(content)
    print(json.dumps(hits), "total", sum(hits.values()), "/", 4 * len(CASES))


if __name__ == "__main__":
    main()
