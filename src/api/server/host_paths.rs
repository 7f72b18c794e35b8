//! Host paths named in requests (mountpoints, cache backings, key and
//! credentials files): the one place that checks them before a route
//! uses them.
//!
//! Invariant: every path a route passes on is absolute. The daemon's
//! working directory is not the client's, so a relative path would name
//! another file than the one the user meant (or none): refused with 422
//! `relative_path`, saying what to give. The `ramd` CLI makes every path
//! absolute before it sends it, so only other API clients meet this.

use std::path::PathBuf;

use axum::http::StatusCode;

use super::error::ApiError;
use crate::cache::backing::BackingSpec;

/// The path `text` given as `field`, when absolute.
pub(crate) fn absolute(field: &str, text: &str) -> Result<PathBuf, ApiError> {
    let path = PathBuf::from(text);
    if path.is_absolute() {
        return Ok(path);
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "relative_path",
        format!(
            "{field} '{text}' is a relative path, which the daemon cannot resolve as you meant (its working directory is not yours): give an absolute path"
        ),
    ))
}

/// A cache backing: an NBD URI, or a file or device by absolute path.
/// (A malformed one is left to the cache's own parse, which says why.)
pub(crate) fn backing(text: &str) -> Result<(), ApiError> {
    match BackingSpec::parse(text) {
        Ok(BackingSpec::Path(_)) => absolute("backing", text).map(drop),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_refused_with_what_to_give() {
        let e = absolute("mountpoint", "mnt/x").unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::UNPROCESSABLE_ENTITY, "relative_path")
        );
        assert!(e.message.contains("mountpoint 'mnt/x'"), "{}", e.message);
        assert!(e.message.contains("absolute path"), "{}", e.message);
        assert_eq!(absolute("f", "/a/b").unwrap(), PathBuf::from("/a/b"));
        assert!(backing("disk.img").is_err());
        assert!(backing("./disk.img").is_err());
        assert!(backing("/srv/disk.img").is_ok());
        for uri in [
            "nbd://h/e",
            "nbds://h:1/e",
            "nbd+unix:///e?socket=/s",
            "nbds+unix:///?socket=/s",
        ] {
            assert!(backing(uri).is_ok(), "{uri}");
        }
    }
}
