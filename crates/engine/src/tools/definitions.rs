//! Definitions (`$defs`, `definitions`) of tool argument schemas, moved to the root of the
//! grammars the schemas join. A `$ref` is a JSON pointer from the root of the schema document
//! (`#/$defs/Unit`), but a tool's schema is nested in a call object, an `anyOf` of calls and a
//! lazy grammar's wrappers, where `#/$defs/Unit` points at nothing: pydantic writes every nested
//! model and enum that way. So each tool's definitions move to the root under a name of their
//! own (`tool0.Unit`), its local pointers are rewritten to match, and every grammar root built
//! from the calls carries the definitions ([`with_definitions`]).

use serde_json::{Map, Value};

/// Takes the definitions out of each of `schemas` (one per tool, in order) and rewrites their
/// local `$ref`s; returns the definitions of all of them, to put at each grammar's root.
pub fn hoist_definitions(schemas: &mut [Value]) -> Map<String, Value> {
    let mut all = Map::new();
    for (i, schema) in schemas.iter_mut().enumerate() {
        let prefix = format!("tool{i}.");
        let mut own = Map::new();
        if let Some(obj) = schema.as_object_mut() {
            for key in ["$defs", "definitions"] {
                if let Some(Value::Object(defs)) = obj.remove(key) {
                    own.extend(defs);
                }
            }
        }
        let mut whole_needed = false;
        rewrite_refs(schema, &prefix, &mut whole_needed);
        for (name, mut def) in own {
            rewrite_refs(&mut def, &prefix, &mut whole_needed);
            all.insert(format!("{prefix}{name}"), def);
        }
        // A pointer into the tool's schema itself (`#`, `#/properties/…`): the schema is kept
        // whole as a definition too.
        if whole_needed {
            all.insert(format!("tool{i}"), schema.clone());
        }
    }
    all
}

/// What every root of a request's call grammars carries: the argument schemas' definitions
/// ([`hoist_definitions`]), and leniency when a tool's schema was sent without `strict`
/// ([`lenient`](crate::constraint::lenient)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallRoots {
    pub defs: Map<String, Value>,
    pub lenient: bool,
}

impl CallRoots {
    /// `root` as a grammar's root: the definitions added, lenient where asked.
    pub fn root(&self, root: Value) -> Value {
        let root = with_definitions(root, &self.defs);
        if self.lenient {
            crate::constraint::lenient(root)
        } else {
            root
        }
    }
}

/// `root` with `defs` as its `$defs` (merged with any it has), when there are any.
fn with_definitions(mut root: Value, defs: &Map<String, Value>) -> Value {
    if defs.is_empty() {
        return root;
    }
    if let Some(obj) = root.as_object_mut() {
        let entry = obj.entry("$defs").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(existing) = entry {
            existing.extend(defs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    root
}

/// Rewrites every local `$ref` in schema `v` for definitions moved under `prefix`.
fn rewrite_refs(v: &mut Value, prefix: &str, whole_needed: &mut bool) {
    match v {
        Value::Object(obj) => {
            for (key, child) in obj.iter_mut() {
                match (key.as_str(), child) {
                    ("$ref", Value::String(r)) => {
                        if let Some(moved) = moved_pointer(r, prefix, whole_needed) {
                            *r = moved;
                        }
                    }
                    // Values, never schemas.
                    ("const" | "enum" | "default" | "examples", _) => {}
                    // Maps from names (which may spell any keyword) to schemas.
                    (
                        "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                        Value::Object(m),
                    ) => {
                        m.values_mut().for_each(|c| rewrite_refs(c, prefix, whole_needed));
                    }
                    (_, child) => rewrite_refs(child, prefix, whole_needed),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|c| rewrite_refs(c, prefix, whole_needed)),
        _ => {}
    }
}

/// Where a local pointer points once the definitions moved: `#/$defs/X…` and
/// `#/definitions/X…` to `#/$defs/<prefix>X…`, any other `#…` into the whole schema's
/// definition (`#/$defs/toolN…`). Other references (remote ones) are left as they are.
fn moved_pointer(r: &str, prefix: &str, whole_needed: &mut bool) -> Option<String> {
    let path = r.strip_prefix('#')?;
    for container in ["/$defs/", "/definitions/"] {
        if let Some(rest) = path.strip_prefix(container) {
            // `prefix` holds neither `~` nor `/`, so it needs no escaping in a pointer.
            return Some(format!("#/$defs/{prefix}{rest}"));
        }
    }
    *whole_needed = true;
    Some(format!("#/$defs/{}{path}", prefix.trim_end_matches('.')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn definitions_move_to_the_root_under_their_tools_name() {
        let mut schemas = vec![
            json!({"type": "object", "$defs": {"C": {"type": "string", "enum": ["red", "green"]}},
                   "properties": {"c": {"$ref": "#/$defs/C"}}, "required": ["c"]}),
            json!({"type": "object", "definitions": {"C": {"type": "integer"}, "P": {"type": "object",
                   "properties": {"c": {"$ref": "#/definitions/C"}, "enum": {"$ref": "#/definitions/C"},
                                  "k": {"const": "#/$defs/C"}}}},
                   "properties": {"p": {"$ref": "#/definitions/P"}}}),
        ];
        let defs = hoist_definitions(&mut schemas);
        assert_eq!(
            schemas[0],
            json!({"type": "object", "properties": {"c": {"$ref": "#/$defs/tool0.C"}}, "required": ["c"]})
        );
        assert_eq!(schemas[1]["properties"]["p"]["$ref"], "#/$defs/tool1.P");
        assert_eq!(defs["tool0.C"], json!({"type": "string", "enum": ["red", "green"]}));
        assert_eq!(defs["tool1.C"], json!({"type": "integer"}));
        assert_eq!(defs["tool1.P"]["properties"]["c"]["$ref"], "#/$defs/tool1.C");
        assert_eq!(defs["tool1.P"]["properties"]["enum"]["$ref"], "#/$defs/tool1.C", "a property may be named 'enum'");
        assert_eq!(defs["tool1.P"]["properties"]["k"]["const"], "#/$defs/C", "a const is data");
        let roots = CallRoots { defs, lenient: true };
        let root = roots.root(json!({"anyOf": [], "$defs": {"Answer": {}}}));
        assert_eq!(root["$defs"].as_object().map(Map::len), Some(4));
        assert_eq!(root["x-guidance"]["lenient"], true);
    }

    #[test]
    fn a_pointer_into_the_schema_itself_keeps_it_whole_as_a_definition() {
        let mut schemas = vec![json!({"type": "object", "properties": {
            "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
            "alias": {"$ref": "#/properties/name"}}})];
        let defs = hoist_definitions(&mut schemas);
        assert_eq!(schemas[0]["properties"]["children"]["items"]["$ref"], "#/$defs/tool0");
        assert_eq!(schemas[0]["properties"]["alias"]["$ref"], "#/$defs/tool0/properties/name");
        assert_eq!(defs["tool0"], schemas[0]);
        let mut plain = vec![json!({"type": "object", "properties": {"a": {"type": "string"}}})];
        assert!(hoist_definitions(&mut plain).is_empty());
        assert_eq!(CallRoots::default().root(json!({"anyOf": []})), json!({"anyOf": []}));
    }
}
