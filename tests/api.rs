//! The REST API against a running `ramd daemon`: every route, every error
//! the issue lists, concurrent creates and deletes, and docs/openapi.yaml
//! kept in sync (every route documented and vice versa, every response the
//! tests receive validated against its schema).

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::openapi::Spec;
use common::*;
use serde_json::{json, Value};

/// A daemon plus the spec every answer is checked against.
struct Api {
    d: Daemon,
    spec: Arc<Spec>,
}

impl Api {
    fn start(extra: &[&str]) -> Api {
        let mut args: Vec<String> = vec!["daemon".into(), "--no-default-drive".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Api {
            d: Daemon::launch(&args, &[]),
            spec: Arc::new(Spec::load()),
        }
    }

    /// Sends a request to `path` (documented as `template`), checks the
    /// answer against the spec, returns (status, JSON or Null).
    #[track_caller]
    fn call(&self, method: &str, template: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        self.spec.call(&self.d, method, template, path, body)
    }

    /// Like `call`, and asserts the status and, for errors, the code.
    #[track_caller]
    fn expect(
        &self,
        method: &str,
        template: &str,
        path: &str,
        body: Option<&str>,
        status: u16,
        code: Option<&str>,
    ) -> Value {
        let (s, v) = self.call(method, template, path, body);
        assert_eq!(s, status, "{method} {path} {body:?}: {v}");
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{method} {path} {body:?}: {v}");
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.len() > 10, "a useless message: {v}");
        }
        v
    }
}

#[test]
fn openapi_documents_exactly_the_routes_the_router_serves() {
    let spec = Spec::load();
    let documented: BTreeSet<(String, String)> = spec.routes().into_iter().collect();
    let served: BTreeSet<(String, String)> = ramd::api::server::ROUTES
        .iter()
        .map(|(m, p)| (m.to_ascii_uppercase(), p.to_string()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/openapi.yaml: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "docs/openapi.yaml documents routes the router lacks: {extra:?}"
    );
}

#[test]
fn every_documented_route_answers_and_unknown_ones_get_json_errors() {
    let api = Api::start(&["--drive", "ram0=1M"]);
    // Every documented route answers something the spec allows (not the
    // router's fallback).
    for (method, template) in api.spec.routes() {
        let mut path = template.replace("{name}", "ram0").replace("{id}", "12345");
        if template == "/v1/events" {
            path.push_str("?count=1"); // one event, then the stream ends
        }
        let body = match method.as_str() {
            "POST" | "PATCH" => Some("{}"),
            _ => None,
        };
        let (status, v) = api.call(&method, &template, &path, body);
        assert_ne!(v["error"]["code"], "no_such_route", "{method} {path}");
        assert_ne!(status, 405, "{method} {path}");
    }
    let s = api.d.http("GET", "/v1/nothing", None);
    assert_eq!(s.0, 404);
    let e: Value = serde_json::from_str(&s.1).unwrap();
    assert_eq!(e["error"]["code"], "no_such_route");
    let s = api.d.http("PUT", "/v1/drives", Some("{}"));
    assert_eq!(s.0, 405, "{}", s.1);
    let e: Value = serde_json::from_str(&s.1).unwrap();
    assert_eq!(e["error"]["code"], "method_not_allowed");
}

#[test]
fn drives_lifecycle_and_every_error() {
    if !require(&["nbdsh"]) {
        return;
    }
    let api = Api::start(&["--mem-budget", "256M"]);
    let d = "/v1/drives";
    let one = "/v1/drives/{name}";

    let h = api.expect("GET", "/v1/health", "/v1/health", None, 200, None);
    assert_eq!(h["status"], "ok");
    assert_eq!(h["memory_budget"]["limit_bytes"], 256u64 << 20);
    let list = api.expect("GET", d, d, None, 200, None);
    assert_eq!(list["drives"], json!([]));

    // Create: sizes as text or bytes.
    let a = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"a","size":"16M"}"#),
        201,
        None,
    );
    assert_eq!(a["size_bytes"], 16u64 << 20);
    assert_eq!(a["origin"], "api");
    assert!(a["uri"]
        .as_str()
        .unwrap()
        .starts_with("nbd+unix:///a?socket="));
    let b = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"b","size":1048576,"mem_limit":"64K","read_only":true}"#),
        201,
        None,
    );
    assert_eq!(
        (b["mem_limit_bytes"].clone(), b["read_only"].clone()),
        (json!(65536), json!(true))
    );
    let got = api.expect("GET", one, "/v1/drives/a", None, 200, None);
    assert_eq!(got["name"], "a");
    let list = api.expect("GET", d, d, None, 200, None);
    let names: Vec<&str> = list["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);

    // Create errors.
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","size":"#),
        400,
        Some("bad_json"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","size":"1M","colour":"red"}"#),
        400,
        Some("unknown_field"),
    );
    let v = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","size":"12Q"}"#),
        422,
        Some("invalid_size"),
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("12Q"),
        "{v}"
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","size":0}"#),
        422,
        Some("invalid_size"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"Bad Name","size":"1M"}"#),
        422,
        Some("invalid_name"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"-x","size":"1M"}"#),
        422,
        Some("invalid_name"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"a","size":"1M"}"#),
        409,
        Some("drive_exists"),
    );
    let v = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"huge","size":"1G"}"#),
        507,
        Some("over_budget"),
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mem-budget"),
        "{v}"
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x"}"#),
        422,
        Some("invalid_request"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","size":true}"#),
        422,
        Some("invalid_request"),
    );
    // A limit or overcommit makes a big drive fit.
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"capped","size":"1G","mem_limit":"32M"}"#),
        201,
        None,
    );
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"thin","size":"1G","overcommit":true}"#),
        201,
        None,
    );
    let (s, body) = api.d.http("POST", d, None);
    assert_eq!(s, 415, "{body}");

    // Patch: grow, lock, unlock, limits.
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"32M"}"#),
        200,
        None,
    );
    assert_eq!(v["size_bytes"], 32u64 << 20);
    assert!(
        v.get("notice").is_none(),
        "API drives are not ephemeral: {v}"
    );
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"read_only":true}"#),
        200,
        None,
    );
    assert_eq!(v["read_only"], true);
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"read_only":false,"mem_limit":"8M"}"#),
        200,
        None,
    );
    assert_eq!(
        (v["read_only"].clone(), v["mem_limit_bytes"].clone()),
        (json!(false), json!(8u64 << 20))
    );
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"mem_limit":"none"}"#),
        200,
        None,
    );
    assert_eq!(v["mem_limit_bytes"], Value::Null);
    api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some("{}"),
        422,
        Some("invalid_request"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"1Z"}"#),
        422,
        Some("invalid_size"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"sise":"1M"}"#),
        400,
        Some("unknown_field"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"#),
        400,
        Some("bad_json"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"10G"}"#),
        507,
        Some("over_budget"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/zz",
        Some(r#"{"size":"1M"}"#),
        404,
        Some("drive_not_found"),
    );

    // Shrinking below data needs force.
    let uri = api.d.http("GET", "/v1/drives/a", None).1;
    let uri = serde_json::from_str::<Value>(&uri).unwrap()["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    python(
        "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\nh.pwrite(b'x'*4096, 20<<20)\nh.shutdown()\n",
        &[&uri],
    )
    .ok();
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"8M"}"#),
        409,
        Some("data_beyond_size"),
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("force"),
        "{v}"
    );
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/a",
        Some(r#"{"size":"8M","force":true}"#),
        200,
        None,
    );
    assert_eq!(v["size_bytes"], 8u64 << 20);

    // Delete with an open connection needs force and says how many.
    let mut holder = KillOnDrop(
        tool("/usr/bin/python3")
            .args([
                "-c",
                "import nbd,sys,time\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\nprint('connected',flush=True)\ntime.sleep(60)\n",
                &uri,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python"),
    );
    wait_until("the client to connect", Duration::from_secs(30), || {
        let v: Value = serde_json::from_str(&api.d.http("GET", "/v1/drives/a", None).1).unwrap();
        v["connections"] == 1
    });
    let v = api.expect("DELETE", one, "/v1/drives/a", None, 409, Some("drive_busy"));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1 open NBD connection"),
        "{v}"
    );
    api.expect(
        "DELETE",
        one,
        "/v1/drives/a?forse=true",
        None,
        400,
        Some("unknown_field"),
    );
    let v = api.expect("DELETE", one, "/v1/drives/a?force=true", None, 200, None);
    assert_eq!(
        (v["name"].clone(), v["closed_connections"].clone()),
        (json!("a"), json!(1))
    );
    wait_until(
        "the daemon to close the client",
        Duration::from_secs(30),
        || {
            let v: Value = serde_json::from_str(&api.d.http("GET", "/v1/stats", None).1).unwrap();
            v["drives"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["name"] != "a")
        },
    );
    let _ = holder.0.kill();
    api.expect(
        "DELETE",
        one,
        "/v1/drives/a",
        None,
        404,
        Some("drive_not_found"),
    );
    api.expect(
        "GET",
        one,
        "/v1/drives/a",
        None,
        404,
        Some("drive_not_found"),
    );
    let v = api.expect("DELETE", one, "/v1/drives/b", None, 200, None);
    assert_eq!(v["closed_connections"], 0);

    // Stats and metrics.
    let st = "/v1/drives/{name}/stats";
    let v = api.expect("GET", st, "/v1/drives/capped/stats", None, 200, None);
    assert_eq!(v["name"], "capped");
    assert!(v["totals"]["ops"].is_object(), "{v}");
    api.expect(
        "GET",
        st,
        "/v1/drives/nope/stats",
        None,
        404,
        Some("drive_not_found"),
    );
    let v = api.expect("GET", "/v1/stats", "/v1/stats", None, 200, None);
    assert_eq!(v["drives"].as_array().unwrap().len(), 2);
    let (s, text) = api.d.http("GET", "/metrics", None);
    assert_eq!(s, 200);
    assert!(
        text.contains("ramd_drive_size_bytes{drive=\"capped\"} 1073741824"),
        "{text}"
    );

    // Attachments: errors (the real mount is in tests/attach.rs).
    let at = "/v1/attachments";
    let v = api.expect("GET", at, at, None, 200, None);
    assert_eq!(v["attachments"], json!([]));
    api.expect(
        "POST",
        at,
        at,
        Some(r#"{"drive":"capped","mountpoint":"relative/dir"}"#),
        422,
        Some("relative_path"),
    );
    let missing = api.d.dir().join("no-such-dir");
    let body = json!({"drive": "capped", "mountpoint": missing}).to_string();
    let v = api.expect("POST", at, at, Some(&body), 422, Some("bad_mountpoint"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("mkdir"),
        "{v}"
    );
    api.expect(
        "POST",
        at,
        at,
        Some(r#"{"drive":"nope","mountpoint":"/tmp"}"#),
        404,
        Some("drive_not_found"),
    );
    api.expect(
        "POST",
        at,
        at,
        Some(r#"{"drive":"capped","mountpoint":"/tmp","ro":1}"#),
        400,
        Some("unknown_field"),
    );
    let del = "/v1/attachments/{id}";
    api.expect(
        "DELETE",
        del,
        "/v1/attachments/99",
        None,
        404,
        Some("attachment_not_found"),
    );
    api.expect(
        "DELETE",
        del,
        "/v1/attachments/abc",
        None,
        404,
        Some("attachment_not_found"),
    );
}

#[test]
fn concurrent_creates_and_deletes_stay_consistent() {
    let api = Arc::new(Api::start(&["--mem-budget", "1G"]));
    let created = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (api, created, deleted) = (api.clone(), created.clone(), deleted.clone());
            std::thread::spawn(move || {
                for i in 0..15 {
                    // A private drive: every step must succeed.
                    let name = format!("t{t}-{i}");
                    let body = json!({"name": name, "size": "4M"}).to_string();
                    let (s, v) = api.call("POST", "/v1/drives", "/v1/drives", Some(&body));
                    assert_eq!(s, 201, "{v}");
                    let path = format!("/v1/drives/{name}");
                    let (s, v) = api.call("GET", "/v1/drives/{name}", &path, None);
                    assert_eq!(s, 200, "{v}");
                    let (s, v) = api.call("DELETE", "/v1/drives/{name}", &path, None);
                    assert_eq!(s, 200, "{v}");
                    // A contended name: exactly one creator wins at a time.
                    let body = json!({"name": "shared", "size": "4M"}).to_string();
                    match api.call("POST", "/v1/drives", "/v1/drives", Some(&body)) {
                        (201, _) => {
                            created.fetch_add(1, Ordering::SeqCst);
                        }
                        (409, v) => assert_eq!(v["error"]["code"], "drive_exists"),
                        other => panic!("create shared: {other:?}"),
                    }
                    match api.call("DELETE", "/v1/drives/{name}", "/v1/drives/shared", None) {
                        (200, _) => {
                            deleted.fetch_add(1, Ordering::SeqCst);
                        }
                        (404, v) => assert_eq!(v["error"]["code"], "drive_not_found"),
                        other => panic!("delete shared: {other:?}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread panicked");
    }
    let (_, list) = api.call("GET", "/v1/drives", "/v1/drives", None);
    let left = list["drives"].as_array().unwrap();
    let shared_left = left.iter().filter(|d| d["name"] == "shared").count() as u64;
    assert_eq!(
        left.len() as u64,
        shared_left,
        "private drives left: {list}"
    );
    assert_eq!(
        created.load(Ordering::SeqCst),
        deleted.load(Ordering::SeqCst) + shared_left,
        "every successful create of 'shared' is matched by a delete or still listed"
    );
    let (_, h) = api.call("GET", "/v1/health", "/v1/health", None);
    let committed = h["memory_budget"]["committed_bytes"].as_u64().unwrap();
    assert_eq!(
        committed > 0,
        shared_left == 1,
        "budget promises leaked: {h}"
    );
}

/// Waits (bounded) until a drive is no longer restoring, checking every
/// answer against the spec.
fn settled(api: &Api, name: &str) -> Value {
    let path = format!("/v1/drives/{name}");
    let mut v = Value::Null;
    wait_until("the restore to end", DAEMON_TIMEOUT, || {
        v = api.expect("GET", "/v1/drives/{name}", &path, None, 200, None);
        v["state"] != "restoring"
    });
    v
}

#[test]
fn persistent_drive_routes_and_errors_match_the_spec() {
    let api = Api::start(&["--drive", "ram0=1M"]);
    let (d, one) = ("/v1/drives", "/v1/drives/{name}");
    let sync = "/v1/drives/{name}/sync";
    let restore = "/v1/drives/{name}/restore";

    // Persistence options that do not fit together.
    for body in [
        r#"{"name":"x","size":"1M","durability":"flush"}"#,
        r#"{"name":"x","size":"1M","persist":true,"durability":"fast"}"#,
        r#"{"name":"x","size":"1M","persist":true,"sync_interval":1}"#,
        r#"{"name":"x","size":"1M","persist":true,"encrypt":true}"#,
        r#"{"name":"x","size":"1M","persist":true,"encrypt":true,"key_file":"k"}"#,
    ] {
        api.expect("POST", d, d, Some(body), 422, Some("invalid_persistence"));
    }
    api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"x","persist":true}"#),
        422,
        Some("invalid_request"),
    );
    api.expect(
        "POST",
        d,
        d,
        Some(
            r#"{"name":"x","size":"1M","persist":true,"encrypt":true,"key_file":"/nonexistent/k"}"#,
        ),
        500,
        Some("persist_error"),
    );

    // A new persistent drive, its status, a sync, a change.
    let v = api.expect(
        "POST",
        d,
        d,
        Some(
            r#"{"name":"p","size":"4M","persist":true,"durability":"flush","sync_interval":"30s"}"#,
        ),
        201,
        None,
    );
    assert_eq!(
        (v["kind"].as_str(), v["state"].as_str()),
        (Some("persistent"), Some("ready"))
    );
    assert_eq!(v["persist"]["durability"], "flush");
    assert_eq!(v["persist"]["sync_interval_ms"], 30_000);
    assert!(v["persist"]["status"].is_object(), "{v}");
    assert_eq!(v["persist"]["restore"], Value::Null);
    let r = api.expect("POST", sync, "/v1/drives/p/sync", None, 200, None);
    assert_eq!(r["name"], "p");
    let v = api.expect(
        "PATCH",
        one,
        "/v1/drives/p",
        Some(r#"{"durability":"none","sync_interval":60000}"#),
        200,
        None,
    );
    assert_eq!(v["persist"]["flush_is_noop"], true);
    api.expect(
        "PATCH",
        one,
        "/v1/drives/p",
        Some(r#"{"sync_interval":"1ms"}"#),
        422,
        Some("invalid_persistence"),
    );
    let s = api.expect(
        "GET",
        "/v1/drives/{name}/stats",
        "/v1/drives/p/stats",
        None,
        200,
        None,
    );
    assert!(s["persist"].is_object(), "{s}");
    api.expect("GET", "/v1/stats", "/v1/stats", None, 200, None);

    // Persistence routes on a RAM drive, a ready drive, no drive.
    api.expect(
        "POST",
        sync,
        "/v1/drives/ram0/sync",
        None,
        409,
        Some("not_persistent"),
    );
    api.expect(
        "POST",
        restore,
        "/v1/drives/ram0/restore",
        Some("{}"),
        409,
        Some("not_persistent"),
    );
    api.expect(
        "POST",
        restore,
        "/v1/drives/p/restore",
        Some("{}"),
        409,
        Some("drive_not_ready"),
    );
    api.expect(
        "POST",
        sync,
        "/v1/drives/nope/sync",
        None,
        404,
        Some("drive_not_found"),
    );
    api.expect(
        "POST",
        restore,
        "/v1/drives/p/restore",
        Some(r#"{"force":true,"discard_journal":true}"#),
        422,
        Some("invalid_request"),
    );
    api.expect(
        "POST",
        restore,
        "/v1/drives/p/restore",
        Some(r#"{"forse":true}"#),
        400,
        Some("unknown_field"),
    );
    api.expect(
        "DELETE",
        one,
        "/v1/drives/ram0?keep_data=true",
        None,
        409,
        Some("not_persistent"),
    );

    // Keep the data, create again: restoring, then ready with a report.
    let v = api.expect(
        "DELETE",
        one,
        "/v1/drives/p?keep_data=true",
        None,
        200,
        None,
    );
    assert_eq!(v["data_kept"], true);
    assert!(
        v["state_dir"].as_str().unwrap().ends_with("drives/p"),
        "{v}"
    );
    let v = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"p","persist":true}"#),
        201,
        None,
    );
    assert_eq!(
        v["size_bytes"],
        4u64 << 20,
        "the size comes from the state directory: {v}"
    );
    let v = settled(&api, "p");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["persist"]["restore"]["phase"], "done", "{v}");
    assert!(v["persist"]["restore"]["summary"]
        .as_str()
        .unwrap()
        .contains("restored"));

    // A damaged meta: failed, with the error; restore keeps failing.
    let v = api.expect(
        "DELETE",
        one,
        "/v1/drives/p?keep_data=true",
        None,
        200,
        None,
    );
    let dir = std::path::PathBuf::from(v["state_dir"].as_str().unwrap());
    std::fs::write(dir.join("meta"), b"damaged").unwrap();
    let v = api.expect(
        "POST",
        d,
        d,
        Some(r#"{"name":"p","size":"4M","persist":true}"#),
        201,
        None,
    );
    assert_eq!(v["state"], "failed", "{v}");
    assert!(v["error"].as_str().unwrap().contains("metadata"), "{v}");
    assert_eq!(v["persist"]["restore"]["phase"], "failed");
    api.expect(
        "POST",
        sync,
        "/v1/drives/p/sync",
        None,
        409,
        Some("drive_not_ready"),
    );
    api.expect(
        "PATCH",
        one,
        "/v1/drives/p",
        Some(r#"{"size":"8M"}"#),
        409,
        Some("drive_not_ready"),
    );
    let v = api.expect(
        "POST",
        restore,
        "/v1/drives/p/restore",
        Some(r#"{"force":true}"#),
        202,
        None,
    );
    assert_eq!(v["state"], "restoring");
    let v = settled(&api, "p");
    assert_eq!(v["state"], "failed", "{v}");
    api.expect("GET", d, d, None, 200, None);
    // Deleting it without keep_data removes the directory.
    let v = api.expect("DELETE", one, "/v1/drives/p", None, 200, None);
    assert_eq!(v["data_kept"], false);
    assert!(!dir.exists());
}

/// Issue 15 item 12: a query string a route does not know is an error,
/// never silently ignored; malformed values too.
#[test]
fn unknown_or_malformed_query_strings_get_400() {
    let api = Api::start(&["--drive", "a=1M"]);
    let code = |v: &str| -> String {
        let v: Value = serde_json::from_str(v).unwrap_or_else(|e| panic!("{e}: {v}"));
        v["error"]["code"].as_str().unwrap_or_default().to_owned()
    };
    for (method, path, want) in [
        ("GET", "/v1/drives?foo=1", "unknown_field"),
        ("GET", "/v1/health?verbose", "unknown_field"),
        ("GET", "/v1/drives/a?x=y", "unknown_field"),
        ("GET", "/v1/stats?drive=a", "unknown_field"),
        ("DELETE", "/v1/drives/a?forse=true", "unknown_field"),
        ("DELETE", "/v1/drives/a?force=maybe", "bad_query"),
        ("DELETE", "/v1/drives/a?force", "bad_query"),
    ] {
        let (status, body) = api.d.http(method, path, None);
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert_eq!(code(&body), want, "{method} {path}: {body}");
    }
    // Nothing was deleted; an empty query is no query.
    let (status, _) = api.d.http("GET", "/v1/drives/a?", None);
    assert_eq!(status, 200);
    let (status, body) = api.d.http("DELETE", "/v1/drives/a?force=true", None);
    assert_eq!(status, 200, "{body}");
}

/// Issue 15 item 12: a memory limit of 0 is refused everywhere (it would
/// refuse every write; "none" removes a limit); sizes may have a space
/// before the unit, as ramd prints them.
#[test]
fn mem_limit_zero_is_refused_and_sizes_may_have_spaces() {
    let api = Api::start(&["--drive", "a=1M"]);
    for body in [r#"{"mem_limit":"0"}"#, r#"{"mem_limit":0}"#] {
        let (status, v) = api.d.http("PATCH", "/v1/drives/a", Some(body));
        assert_eq!(status, 422, "{body}: {v}");
        assert!(v.contains("invalid_size") && v.contains("none"), "{v}");
    }
    let (status, v) = api.d.http(
        "POST",
        "/v1/drives",
        Some(r#"{"name":"b","size":"1M","mem_limit":"0"}"#),
    );
    assert_eq!(status, 422, "{v}");
    let v = api.expect(
        "POST",
        "/v1/drives",
        "/v1/drives",
        Some(r#"{"name":"c","size":"1 M","mem_limit":" 512 KiB "}"#),
        201,
        None,
    );
    assert_eq!(v["size_bytes"], 1u64 << 20);
    assert_eq!(v["mem_limit_bytes"], 512u64 << 10);
    let v = api.expect(
        "PATCH",
        "/v1/drives/{name}",
        "/v1/drives/c",
        Some(r#"{"mem_limit":"none"}"#),
        200,
        None,
    );
    assert_eq!(v["mem_limit_bytes"], Value::Null);
}

/// Issue 15 item 12: a key file that is not a key (say /etc/shadow) is
/// never named in a command that would overwrite it.
#[test]
fn key_file_errors_never_suggest_overwriting_the_file() {
    let api = Api::start(&[]);
    let not_a_key = api.d.dir().join("shadow");
    std::fs::write(&not_a_key, "root:*:19000:0:99999:7:::\n".repeat(20)).unwrap();
    // Private, as a key must be (one others may read is refused first).
    std::fs::set_permissions(
        &not_a_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let missing = api.d.dir().join("missing.key");
    for (name, key) in [("a", &not_a_key), ("b", &missing)] {
        let body = json!({"name": name, "size": "1M", "persist": true, "encrypt": true,
                          "key_file": key.display().to_string()})
        .to_string();
        let (status, v) = api.d.http("POST", "/v1/drives", Some(&body));
        assert!(status >= 400, "{v}");
        let shown = key.display().to_string();
        assert!(v.contains(&shown), "the message names the file: {v}");
        if key == &not_a_key {
            assert!(
                !v.contains(&format!("> {shown}")),
                "suggests overwriting {shown}: {v}"
            );
            assert!(v.contains("NEW_KEY_FILE"), "{v}");
        } else {
            assert!(
                v.contains("set -C"),
                "creating it must refuse to clobber: {v}"
            );
        }
    }
    assert!(std::fs::read_to_string(&not_a_key)
        .unwrap()
        .starts_with("root:"));
}

/// Issue 15 item 11 (API): a persistent drive created again keeps the
/// settings in its drive.json that the request does not give, and the
/// answer says which.
#[test]
fn recreated_persistent_drive_keeps_stored_settings_and_says_which() {
    let api = Api::start(&[]);
    let v = api.expect(
        "POST",
        "/v1/drives",
        "/v1/drives",
        Some(r#"{"name":"db","size":"1M","persist":true,"durability":"flush","sync_interval":"10s","mem_limit":"512K"}"#),
        201,
        None,
    );
    assert_eq!(v["persist"]["durability"], "flush");
    let (s, b) = api.d.http("DELETE", "/v1/drives/db?keep_data=true", None);
    assert_eq!(s, 200, "{b}");
    // Durability given explicitly: that one is new, the rest is kept.
    let v = api.expect(
        "POST",
        "/v1/drives",
        "/v1/drives",
        Some(r#"{"name":"db","persist":true,"durability":"none"}"#),
        201,
        None,
    );
    let notice = v["notice"].as_str().unwrap_or_default();
    assert!(notice.contains("drive.json"), "{v}");
    assert!(notice.contains("sync interval 10s"), "{v}");
    assert!(notice.contains("memory limit 512 KiB"), "{v}");
    assert!(!notice.contains("durability"), "durability was given: {v}");
    assert_eq!(v["persist"]["durability"], "none");
    assert_eq!(v["persist"]["sync_interval_ms"], 10_000);
    assert_eq!(v["mem_limit_bytes"], 512u64 << 10);
    let v = settled(&api, "db");
    assert_eq!(v["state"], "ready", "{v}");
    // Recorded right after the restore (the drive serves meanwhile).
    let file = api.d.state_dir().join("drives/db/drive.json");
    let mut stored = Value::Null;
    wait_until(
        "drive.json to record the new durability",
        DAEMON_TIMEOUT,
        || {
            stored = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            stored["durability"] == "none"
        },
    );
    assert_eq!(stored["sync_interval_ms"], 10_000);
}
