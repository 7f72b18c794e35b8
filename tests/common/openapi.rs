//! docs/openapi.yaml as a checker: the routes it lists, and validation of
//! API responses against its schemas (JSON Schema 2020-12, as OpenAPI 3.1).

use serde_json::Value;

/// The parsed spec.
pub struct Spec {
    pub doc: Value,
}

impl Spec {
    /// Loads docs/openapi.yaml from the repository.
    pub fn load() -> Spec {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml");
        let text = std::fs::read_to_string(path).expect("read docs/openapi.yaml");
        let doc: Value = serde_norway::from_str(&text).expect("docs/openapi.yaml is valid YAML");
        Spec { doc }
    }

    /// Every (METHOD, path) the spec documents.
    pub fn routes(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                    out.push((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
        out.sort();
        out
    }

    /// Follows a local `$ref`.
    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let ptr = r.strip_prefix('#').expect("local $ref");
                self.doc
                    .pointer(ptr)
                    .unwrap_or_else(|| panic!("dangling $ref {r}"))
            }
            None => v,
        }
    }

    /// One request to the daemon's API at `path` (documented as
    /// `template`), its answer checked against the spec: (status, the
    /// answer as JSON, Null when it is not JSON).
    #[track_caller]
    pub fn call(
        &self,
        d: &super::Daemon,
        method: &str,
        template: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, text) = d.http(method, path, body);
        self.check(method, template, status, &text);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Checks that `status` is documented for `method path` and that a JSON
    /// `body` matches its schema. Panics with the reason otherwise.
    #[track_caller]
    pub fn check(&self, method: &str, path: &str, status: u16, body: &str) {
        let op = &self.doc["paths"][path][method.to_ascii_lowercase()];
        assert!(
            op.is_object(),
            "{method} {path} is not in docs/openapi.yaml"
        );
        let resp = &op["responses"][status.to_string()];
        assert!(
            resp.is_object(),
            "{method} {path} answered {status}, which docs/openapi.yaml does not list; body: {body}"
        );
        let resp = self.resolve(resp);
        let Some(schema) = resp.pointer("/content/application~1json/schema") else {
            return; // not JSON (e.g. /metrics)
        };
        let instance: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{method} {path} {status}: body is not JSON ({e}): {body}"));
        let root = serde_json::json!({
            "allOf": [schema],
            "components": self.doc["components"],
        });
        let validator = jsonschema::draft202012::new(&root).expect("the schema compiles");
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {path} {status}: body does not match docs/openapi.yaml:\n  {}\nbody: {body}",
            errors.join("\n  ")
        );
    }
}
